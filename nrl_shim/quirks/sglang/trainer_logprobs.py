"""SGLang rollout logprobs as the trainer computes them, where the trainer filters its logits with top-k/top-p.

SGLang returns, for a sampled token, the full-vocabulary `log_softmax(logits / T)` (measured: gap 1.3e-5), which is
what TRL, verl and a hand-written loop compute. NeMo RL HEAD's trainer filters its training logits with the rollout's
top-k/top-p (`nemo_rl.algorithms.logits_sampling_utils.apply_top_k_top_p`: top-k, then top-p over what top-k kept,
renormalised) and compares its logprobs to the rollout's: off by the log of the kept mass per token (0.22 measured at
T=0.7, top-p 0.8), no error. SGLang 0.5.12.post1 (NeMo RL's pin) has no way to ask for the renormalised value (from
0.5.18, `return_sampling_mask` returns SGLang's own kept set and logprobs over it apart, under another name; slime
patches the same into 0.5.15.post1).

The fix, with vLLM's setting (NRL_SHIM_LOGPROBS, one setting for both engines: settings.ENGINE_VARIABLES):
`truncated`, or `auto` in a job that runs NeMo RL's trainer-side code (HEAD): the sampler's logprobs of rows with top-k
or top-p are renormalised as NeMo RL's trainer does (the sampled token's and the top-logprobs alike). `full` (and
`auto` elsewhere): SGLang's own values, already the full-vocabulary ones: nothing to change.

Where `auto` is decided: in every process that imports `nemo_rl` (a target of this fix: NeMo RL's Ray actor, its
driver) and again where the engine is launched (`_set_envs_and_config`, in the process that calls
`Engine(...)`/`launch_server`), written to the environment (HANDOFF), which every process started from there inherits
(NeMo RL HEAD runs `launch_server` in a spawn child of its actor, where `nemo_rl` is never imported;
`python -m sglang.launch_server` from a NeMo RL process; the scheduler processes) and ray-propagate-env ships to Ray
workers (an NRL_SHIM_* variable). Left out: a launcher that never imported `nemo_rl` and never had an ancestor that
did (nothing tells it that the trainer is NeMo RL's: set NRL_SHIM_LOGPROBS=truncated there).

Left as SGLang has them (said in the docs): greedy rows (`log_softmax(logits)`; SGLang samples a greedy request in a
mixed batch as temperature 1, top-k 1, so a row with top-k 1 is taken as greedy, alone or batched alike),
`SGLANG_RETURN_ORIGINAL_LOGPROB=1` (logprobs of the unscaled logits, asked for as they are), prompt (input)
logprobs, min-p (NeMo RL does not train with it), the tokens speculative decoding accepts (EAGLE, NGRAM: their
logprobs are computed by SGLang's speculative workers outside the two functions this fix wraps; read in every wheel,
not run: those workers need CUDA). Where SGLang's own sampling keeps a token NeMo RL's filter would
not (both top-k and top-p set: SGLang applies top-p to the full distribution), that token's logprob is NeMo RL's:
the float minimum.
"""

import contextvars
import os

from nrl_shim.quirks._trainer import trainer_truncates
from nrl_shim.quirks.sglang import SGLANG_SINCE, SGLANG_VERIFIED

ID = "sglang-trainer-logprobs"
SUMMARY = (
    "SGLang returns the trainer's logprobs: renormalised over the tokens top-k/top-p keep where the trainer filters "
    "its logits that way (NeMo RL HEAD; NRL_SHIM_LOGPROBS), else SGLang's full-vocabulary ones"
)
LINK = "https://github.com/NVIDIA-NeMo/RL/issues/3497"
LIBRARY = "sglang"
# Read in the wheels 0.5.10 -> 0.5.23: Sampler.forward(logits_output, sampling_info, ...) and where it hands the logprobs
# on (Sampler._attach_logprobs_to_output up to 0.5.1x; OutputLogprobProcessor.compute_logprobs in 0.5.23), engine.
# _set_envs_and_config in the launching process. Run on real servers: 0.5.10.post1, 0.5.12.post1 and 0.5.23.
VERSIONS, VERIFIED = SGLANG_SINCE, SGLANG_VERIFIED
_SAMPLER = "sglang.srt.layers.sampler"
_PROCESSOR = "sglang.srt.layers.logprob_processor"
_ENGINE = "sglang.srt.entrypoints.engine"
REQUIRES = (
    f"{_SAMPLER}:Sampler.forward(logits_output, sampling_info)",
    f"{_ENGINE}:_set_envs_and_config(server_args)",
)
# Where the launching process hands its decision to the engine's scheduler processes (they inherit its environment):
# the name of the trainer that truncates. Internal to the shim; not a setting.
HANDOFF = "NRL_SHIM_SGLANG_TRUNCATING_TRAINER"
ORIGINAL_LOGPROB = "SGLANG_RETURN_ORIGINAL_LOGPROB"
WHAT = "SGLang logprobs of requests sampled with top-k/top-p"
_BATCH: "contextvars.ContextVar" = contextvars.ContextVar("nrl_shim_sglang_sampling_info", default=None)
_SAID: set = set()


def describe(settings, version):
    mode = settings.logprobs
    if mode == "full":
        return "NRL_SHIM_LOGPROBS=full: SGLang's full-vocabulary logprobs (already the trainer's): nothing to change"
    where = "always" if mode == "truncated" else "where the job runs NeMo RL HEAD's trainer (its top-k/top-p filter)"
    return (
        f"logprobs of top-k/top-p rows renormalised over the tokens they keep, {where}; greedy and prompt as SGLang's"
    )


# --- the launching process: decide ---


def patch_engine(module, settings):
    from nrl_shim.patching import wrap

    def set_envs_wrapper(wrapped, instance, args, kwargs):
        _decide(settings.logprobs)
        return wrapped(*args, **kwargs)

    wrap(module, "_set_envs_and_config", set_envs_wrapper, ID)


def unpatch_engine(module):
    from nrl_shim.patching import unwrap

    unwrap(module, "_set_envs_and_config", ID)


def _decide(mode):
    trainer = {"truncated": "NRL_SHIM_LOGPROBS=truncated", "full": None}.get(mode)
    if mode == "auto":
        # This process's trainer, or an ancestor's word (a spawn child of NeMo RL's actor has no `nemo_rl` of its own)
        trainer = trainer_truncates() or os.environ.get(HANDOFF)
    if trainer:
        os.environ[HANDOFF] = trainer
    else:
        os.environ.pop(HANDOFF, None)


# --- a process that imports NeMo RL: decide, for every process started from it ---

_TRAINER = "nemo_rl"
_BEFORE: list = []  # HANDOFF as patch_trainer found it, once it wrote it (for unpatch_trainer)


def patch_trainer(module, settings):
    trainer = trainer_truncates() if settings.logprobs == "auto" else None
    if trainer:
        if not _BEFORE:
            _BEFORE.append(os.environ.get(HANDOFF))
        os.environ[HANDOFF] = trainer


def unpatch_trainer(module):
    if _BEFORE:
        before = _BEFORE.pop()
        if before is None:
            os.environ.pop(HANDOFF, None)
        else:
            os.environ[HANDOFF] = before


# --- the scheduler process: the sampler ---


def _truncating(mode):
    """Whether this scheduler process renormalises: `truncated`, or `auto` with the launching process's word."""
    return mode == "truncated" or (mode == "auto" and bool(os.environ.get(HANDOFF)))


def patch_sampler(module, settings):
    from nrl_shim.patching import wrap

    mode = settings.logprobs
    # SGLang's own switch for the logprobs of the unscaled logits (read at its import, as SGLang does): asked for as
    # they are, never renormalised
    original = os.environ.get(ORIGINAL_LOGPROB, "false").lower() in ("true", "1")

    def forward_wrapper(wrapped, instance, args, kwargs):
        sampling_info = args[1] if len(args) > 1 else kwargs.get("sampling_info")
        token = _BATCH.set(sampling_info if _truncating(mode) and not original else None)
        try:
            return wrapped(*args, **kwargs)
        finally:
            _BATCH.reset(token)

    wrap(module.Sampler, "forward", forward_wrapper, ID)
    if hasattr(module.Sampler, "_attach_logprobs_to_output"):  # up to 0.5.1x: (logits_output, logprobs, ...)
        wrap(module.Sampler, "_attach_logprobs_to_output", _attach_wrapper, ID)


def unpatch_sampler(module):
    from nrl_shim.patching import unwrap

    unwrap(module.Sampler, "forward", ID)
    if hasattr(module.Sampler, "_attach_logprobs_to_output"):
        unwrap(module.Sampler, "_attach_logprobs_to_output", ID)


def patch_processor(module, settings):
    from nrl_shim.patching import wrap

    wrap(module.OutputLogprobProcessor, "compute_logprobs", _compute_wrapper, ID)


def unpatch_processor(module):
    from nrl_shim.patching import unwrap

    unwrap(module.OutputLogprobProcessor, "compute_logprobs", ID)


TARGETS = {
    _TRAINER: (patch_trainer, unpatch_trainer),
    _ENGINE: (patch_engine, unpatch_engine),
    _SAMPLER: (patch_sampler, unpatch_sampler),
    _PROCESSOR: (patch_processor, unpatch_processor),
}


def _attach_wrapper(wrapped, instance, args, kwargs):
    # (logits_output, logprobs, top_logprobs_nums, token_ids_logprobs, sampling_info, batch_next_token_ids)
    if len(args) > 1 and _BATCH.get() is not None:
        args = (args[0], renormalised(args[1], _BATCH.get()), *args[2:])
    return wrapped(*args, **kwargs)


def _compute_wrapper(wrapped, instance, args, kwargs):
    # (logprobs, top_logprobs_nums, token_ids_logprobs, batch_next_token_ids)
    if args and _BATCH.get() is not None:
        args = (renormalised(args[0], _BATCH.get()), *args[1:])
    return wrapped(*args, **kwargs)


def renormalised(logprobs, sampling_info):
    """`logprobs` ([rows, vocab], log_softmax(logits / T)) of the rows sampled with top-k or top-p, renormalised over
    the tokens NeMo RL's apply_top_k_top_p keeps (top-k, ties kept; then top-p over the top-k-renormalised
    probabilities, the most likely token always kept); other rows as they are."""
    import torch

    if getattr(sampling_info, "is_all_greedy", False) or not (
        getattr(sampling_info, "need_top_k_sampling", False) or getattr(sampling_info, "need_top_p_sampling", False)
    ):
        return logprobs
    rows, vocab = logprobs.shape
    top_ks = sampling_info.top_ks.to(logprobs.device).long().clamp(1, vocab)
    top_ps = sampling_info.top_ps.to(logprobs.device, logprobs.dtype)
    temperatures = sampling_info.temperatures.to(logprobs.device).view(-1)
    truncated = (top_ks < vocab) | (top_ps < 1.0)
    # Greedy rows, left as SGLang has them. In a mixed batch SGLang samples a greedy request as temperature 1, top-k 1
    # (its SamplingParams), and an all-greedy batch never gets here: top-k 1 is greedy, batched or not.
    truncated &= (temperatures > 1e-5) & (top_ks > 1)
    if not bool(truncated.any()):
        return logprobs
    ascending, order = logprobs.sort(dim=-1)
    threshold = ascending.gather(-1, (vocab - top_ks).unsqueeze(-1))
    keep = ascending >= threshold
    after_top_k = ascending.masked_fill(~keep, float("-inf"))
    cumulative = after_top_k.softmax(dim=-1).cumsum(dim=-1)
    keep_p = cumulative > (1 - top_ps).unsqueeze(-1)
    keep_p[..., -1] = True
    kept = after_top_k.masked_fill(~keep_p, float("-inf"))
    kept = kept - kept.logsumexp(dim=-1, keepdim=True)
    result = torch.empty_like(logprobs).scatter_(-1, order, kept)
    result.clamp_(min=torch.finfo(result.dtype).min)
    out = torch.where(truncated.unsqueeze(-1), result, logprobs)
    _say(os.environ.get(HANDOFF) or "NRL_SHIM_LOGPROBS=truncated")
    return out


def _say(trainer):
    from nrl_shim import report

    if "said" in _SAID:
        return
    _SAID.add("said")
    report.changed(
        ID,
        WHAT,
        "full-vocabulary log_softmax(logits / T)",
        "renormalised over the tokens top-k/top-p keep",
        f"the trainer filters its logits so ({trainer}); greedy rows, prompt logprobs and min-p as SGLang's; {LINK}",
    )
