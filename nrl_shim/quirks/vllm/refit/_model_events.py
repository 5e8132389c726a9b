"""vLLM's "a model was loaded / its weights changed" events, below the refit fixes (not a quirk), and the refit state
their engine side shares. One hook each, so that a fix (and the probe to come) subscribes instead of wrapping vLLM
again:

- `loaded`: BaseModelLoader.load_model, the one load step of every loader from 0.9 (default, dummy, sharded...), is
  wrapped once for all the fixes subscribed (`subscribe_load`, from a fix's patch of base_loader; `unsubscribe_load` from
  its unpatch). Each subscriber may bracket the load (`around(vllm_config)`: a context manager, entered before it, left
  after every `loaded` call) and gets the model once it returned (`loaded(model, loader, vllm_config, model_config)`),
  in subscription order (registry order: the order the fixes' own wrappers ran in before). A subscriber that fails never
  breaks the load: one DEBUG line.
- `refit`: each fix's ModelWatch puts its own layer on a watched model's `load_weights` (the class and other models stay
  untouched; each fix's layer comes off alone, in any order: tests/test_vllm_refit_unwrap_order.py), counts the calls
  and hands the model to the fix after each one, a failed one too (it may have written some tensors).
- In the engine process: RefitState, per scheduler, what a fix knows of refits since the last successful reset of its
  cache (this process's refits, and the workers' counts asked through collective_rpc), with the wrappers both prefix
  cache fixes (V1's engine core, V0's engine) use around collective_rpc and reset_prefix_cache.

Models are kept weakly: an engine that goes away takes its model with it.
"""

import functools

TYPE_CHECKING = False  # not typing's: quirk modules stay stdlib-light
if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager
    from typing import Any

# The name of the one load_model layer in nrl_shim.patching: not a quirk id, the hook every subscribed fix shares.
LOAD_HOOK = "vllm-model-loaded"
# quirk id -> (around, loaded); insertion order is subscription order.
_LOAD_SUBSCRIBERS: "dict[str, tuple[Callable[..., AbstractContextManager[Any]] | None, Callable[..., Any] | None]]" = {}
_WATCHES: "dict[str, ModelWatch]" = {}  # quirk id -> its watch (the wrapper finds it there: picklable, no closure)


# --- loaded ---


def subscribe_load(module, quirk_id, loaded=None, around=None):
    """Have `loaded(model, loader, vllm_config, model_config)` called after each BaseModelLoader.load_model of
    `module` (a vLLM module that has BaseModelLoader: base_loader, or a loader module importing it), and
    `around(vllm_config)` entered for the load itself."""
    from nrl_shim.patching import wrap

    _LOAD_SUBSCRIBERS[quirk_id] = (around, loaded)
    wrap(module.BaseModelLoader, "load_model", _load_model_wrapper, LOAD_HOOK)


def unsubscribe_load(module, quirk_id):
    """The fix's subscription off; the hook itself with the last one."""
    from nrl_shim.patching import unwrap

    _LOAD_SUBSCRIBERS.pop(quirk_id, None)
    if not _LOAD_SUBSCRIBERS:
        unwrap(module.BaseModelLoader, "load_model", LOAD_HOOK)


def _load_model_wrapper(wrapped, instance, args, kwargs):
    import contextlib

    # BaseModelLoader.load_model(vllm_config, model_config, ...): the config as passed, by name or position.
    vllm_config = kwargs.get("vllm_config", args[0] if args else None)
    model_config = kwargs.get("model_config", args[1] if len(args) > 1 else None)
    model_config = model_config or getattr(vllm_config, "model_config", None)
    subscribers = list(_LOAD_SUBSCRIBERS.items())
    with contextlib.ExitStack() as stack:
        for quirk_id, (around, _) in subscribers:
            if around is not None:
                _quietly(quirk_id, "bracket the load", lambda around=around: stack.enter_context(around(vllm_config)))
        model = wrapped(*args, **kwargs)
        for quirk_id, (_, loaded) in subscribers:
            if loaded is not None:
                _quietly(
                    quirk_id,
                    "follow the model",
                    lambda loaded=loaded: loaded(model, instance, vllm_config, model_config),
                )
    return model


def _quietly(quirk_id, what, call):
    try:
        call()
    except Exception as error:  # never break a load over a fix
        from nrl_shim import report

        report.logger().debug("[%s] could not %s: %r", quirk_id, what, error)


# --- refit ---


class ModelWatch:
    """One fix's watched models. `after_refit(model)`, if given, runs after each `load_weights` call of a watched
    model, a failed one too (it may have written some tensors); `before_refit(model, args, kwargs)`, if given, before
    it, returning the (args, kwargs) to call it with (the probe passes the weights on through its own iterable)."""

    def __init__(
        self,
        quirk_id: str,
        after_refit: "Callable[[Any], None] | None" = None,
        before_refit: "Callable[[Any, Any, Any], tuple[Any, Any]] | None" = None,
    ) -> None:
        self.quirk_id = quirk_id
        self.after_refit = after_refit
        self.before_refit = before_refit
        self.refits = 0  # load_weights calls of watched models in this process
        self._models: Any = None  # WeakSet, created on first use
        _WATCHES[quirk_id] = self

    def watch(self, model: "Any") -> bool:
        """Follow `model`'s refits; False when it has no load_weights or is followed already."""
        from nrl_shim.patching import is_instance_wrapped, wrap_instance

        if not callable(getattr(model, "load_weights", None)) or is_instance_wrapped(
            model, "load_weights", self.quirk_id
        ):
            return False
        wrap_instance(model, "load_weights", functools.partial(_load_weights_wrapper, self.quirk_id), self.quirk_id)
        if self._models is None:
            import weakref

            self._models = weakref.WeakSet()
        self._models.add(model)
        return True

    def loaded(self, model: "Any", loader: "Any" = None, vllm_config: "Any" = None, model_config: "Any" = None) -> None:
        """A `loaded` subscriber (subscribe_load) that follows every model loaded."""
        self.watch(model)

    def unwatch_all(self) -> None:
        from nrl_shim.patching import unwrap_instance

        for model in list(self._models or ()):
            unwrap_instance(model, "load_weights", self.quirk_id)
            self._models.discard(model)

    def __len__(self) -> int:
        return len(self._models or ())


def _load_weights_wrapper(quirk_id, wrapped, instance, args, kwargs):
    watch = _WATCHES.get(quirk_id)
    if watch is not None and watch.before_refit is not None:
        try:
            args, kwargs = watch.before_refit(instance, args, kwargs)
        except Exception as error:  # never break a refit over a fix: the call goes on as made
            from nrl_shim import report

            report.logger().debug("[%s] could not look at the refit: %r", quirk_id, error)
    try:
        return wrapped(*args, **kwargs)
    finally:  # a failed call may have written some tensors: still a refit
        watch = _WATCHES.get(quirk_id)
        if watch is not None:
            watch.refits += 1
            if watch.after_refit is not None:
                watch.after_refit(instance)


def worker_refits(quirk_id, worker=None):
    """Run in each worker by the engine (collective_rpc passes the worker; functools.partial(worker_refits, ID), a
    picklable question): this process's refit count for that fix, or None when no model here is watched (the shim is
    not active in that worker)."""
    watch = _WATCHES.get(quirk_id)
    return watch.refits if watch is not None and len(watch) else None


# --- the engine side: refits since the cache was last reset ---


class RefitState:
    """Per scheduler: what fix `watch.quirk_id` knows of refits since the last successful reset of its cache."""

    def __init__(self, watch: "ModelWatch") -> None:
        self.watch = watch
        self.local_seen = watch.refits
        self.pending: str | None = None  # why a reset is due, or None
        self.ours = False  # inside the fix's own reset call
        self.resets = 0
        self.kinds_logged: set = set()  # each kind of line logged at INFO once

    def absorb_local(self) -> None:
        if self.watch.refits != self.local_seen:
            self.local_seen = self.watch.refits
            self.pending = self.pending or "the model was refit in this process"


def ask_workers(executor: "Any", quirk_id: str) -> "tuple[tuple[Any, ...] | None, str]":
    """The workers' refit counts for the fix (a None per worker that cannot say), and why they may not know."""
    try:
        return tuple(executor.collective_rpc(functools.partial(worker_refits, quirk_id))), "a worker without the shim"
    except Exception as error:  # e.g. a worker without nrl_shim can't unpickle the question
        return None, f"{type(error).__name__}"


def workers_refit(counts: "tuple[Any, ...] | None", last: "tuple[Any, ...] | None", why: str) -> "str | None":
    """Why a reset is due after a collective_rpc, from the workers' counts now and at the last question; None: not."""
    if counts is None or None in counts:
        # The workers can't say: any RPC may have refit them. A reset too many costs a prefix recompute; a stale hit
        # costs correctness.
        return f"a collective_rpc ran in workers whose refits the shim can't see ({why})"
    if counts != last and (last is not None or any(counts)):
        return "the model was refit in its worker(s)"
    return None


def collective_rpc_wrapper(quirk_id: str, after_rpc: "Callable[[Any], None]") -> "Callable[..., Any]":
    """A wrapper of an engine's collective_rpc: `after_rpc(engine)` after each call, a failed one too (a refit that
    failed half-way still changed weights); its own failure is one DEBUG line."""

    def wrapper(wrapped, instance, args, kwargs):
        try:
            return wrapped(*args, **kwargs)
        finally:
            _quietly(quirk_id, "ask the workers about refits", lambda: after_rpc(instance))

    return wrapper


def reset_wrapper(quirk_id: str, what: str, attribute: str) -> "Callable[..., Any]":
    """A wrapper of a scheduler's reset_prefix_cache: a reset the caller made itself after its refit, before the next
    step, is the fix's reset (one line, nothing done twice). `attribute`: where the scheduler keeps its RefitState."""

    def wrapper(wrapped, instance, args, kwargs):
        state = vars(instance).get(attribute)
        if state is not None and not state.ours:
            state.absorb_local()
        ok = wrapped(*args, **kwargs)
        if ok and state is not None and state.pending and not state.ours:
            from nrl_shim import report

            report.unchanged(quirk_id, what, "the caller reset it itself after its refit, before the next step")
            state.pending = None
        return ok

    return wrapper


def scheduler_handlers(
    quirk_id: str,
    what: str,
    attribute: str,
    state_of: "Callable[[Any], RefitState | None]",
    invalidate: "Callable[[Any, Any], None]",
    after: "Callable[[Any, Any], None] | None" = None,
) -> "tuple[Callable[[Any, Any], None], Callable[[Any], None]]":
    """(patch, unpatch) of a scheduler module (V1's vllm.v1.core.sched.scheduler, V0's vllm.core.scheduler) for a
    prefix-cache fix. Before each step: the scheduler's state (`state_of`: None where its prefix caching is off), this
    process's refits taken in, `invalidate(scheduler, state)` when a reset is due, then `after(scheduler, state)`; and
    reset_wrapper on its reset_prefix_cache. The callables are looked up by the fix's module at each call."""

    def schedule_wrapper(wrapped: "Any", instance: "Any", args: "Any", kwargs: "Any") -> "Any":
        state = state_of(instance)
        if state is not None:
            state.absorb_local()
            if state.pending:
                invalidate(instance, state)
            if after is not None:
                after(instance, state)
        return wrapped(*args, **kwargs)

    def patch(module: "Any", settings: "Any") -> None:
        from nrl_shim.patching import wrap

        wrap(module.Scheduler, "schedule", schedule_wrapper, quirk_id)
        wrap(module.Scheduler, "reset_prefix_cache", reset_wrapper(quirk_id, what, attribute), quirk_id)

    def unpatch(module: "Any") -> None:
        from nrl_shim.patching import unwrap

        unwrap(module.Scheduler, "schedule", quirk_id)
        unwrap(module.Scheduler, "reset_prefix_cache", quirk_id)

    return patch, unpatch


def block_pools(manager: "Any") -> "list[Any]":
    """Every block pool a V1 scheduler's KV cache manager allocates from (one per engine; kept general: a hybrid
    model's groups may each have one). The prefix-cache fix drops their entries; the probe notes them."""
    coordinator = getattr(manager, "coordinator", None)
    pools = [getattr(group, "block_pool", None) for group in getattr(coordinator, "single_type_managers", ())]
    pools.append(getattr(coordinator, "block_pool", None) or getattr(manager, "block_pool", None))
    return [pool for pool in dict.fromkeys(pools) if pool is not None]
