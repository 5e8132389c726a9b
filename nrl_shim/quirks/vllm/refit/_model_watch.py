"""The models a refit fix follows in this process (not a quirk): each one's `load_weights`, the call every framework's
refit goes through, wrapped on the instance, counted, and handed to the fix after each call.

Several refit fixes need the same three things: a layer on one model's `load_weights` (the class and other models
stay untouched; other fixes' layers on it stay as they are), the number of refits this process saw, and every layer
taken off again at unpatch. Models are kept weakly: an engine that goes away takes its model with it.
"""

import functools

TYPE_CHECKING = False  # not typing's: quirk modules stay stdlib-light
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_WATCHES: "dict[str, ModelWatch]" = {}  # quirk id -> its watch (the wrapper finds it there: picklable, no closure)


class ModelWatch:
    """One fix's watched models. `after_refit(model)`, if given, runs after each `load_weights` call of a watched
    model, a failed one too (it may have written some tensors)."""

    def __init__(self, quirk_id: str, after_refit: "Callable[[Any], None] | None" = None) -> None:
        self.quirk_id = quirk_id
        self.after_refit = after_refit
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

    def unwatch_all(self) -> None:
        from nrl_shim.patching import unwrap_instance

        for model in list(self._models or ()):
            unwrap_instance(model, "load_weights", self.quirk_id)
            self._models.discard(model)

    def __len__(self) -> int:
        return len(self._models or ())


def _load_weights_wrapper(quirk_id, wrapped, instance, args, kwargs):
    try:
        return wrapped(*args, **kwargs)
    finally:  # a failed call may have written some tensors: still a refit
        watch = _WATCHES.get(quirk_id)
        if watch is not None:
            watch.refits += 1
            if watch.after_refit is not None:
                watch.after_refit(instance)
