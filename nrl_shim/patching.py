"""wrapt-based wrapping that stays correct when other tools wrap the same function (ddtrace, OTel, a profiler).

Each layer we add is marked with its quirk id, so wrap() is idempotent and unwrap() removes exactly our layer.
If another wrapper was stacked over ours, removing ours would need rewriting theirs, so unwrap() instead turns our
layer into a pass-through and a later wrap() turns it back on: either way the fix is applied exactly once.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import wrapt

# wrapper(wrapped, instance, args, kwargs), as wrapt calls it
Wrapper = Callable[[Callable[..., Any], Any, tuple, dict], Any]


class _Layer:
    """The wrapper function wrapt calls; `enabled` False makes it a pass-through."""

    def __init__(self, quirk_id: str, wrapper: Wrapper) -> None:
        self.quirk_id, self.wrapper, self.enabled = quirk_id, wrapper, True

    def __call__(self, wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        if self.enabled:
            return self.wrapper(wrapped, instance, args, kwargs)
        return wrapped(*args, **kwargs)


class _BoundShimWrapper(wrapt.BoundFunctionWrapper):
    def __reduce_ex__(self, protocol: Any) -> Any:
        # A method pickles as "getattr(owner, name)", as a plain bound method would (wrapt proxies refuse to pickle).
        owner = self._self_instance if self._self_instance is not None else getattr(self, "_self_owner", None)
        return getattr, (owner, self.__name__)  # type: ignore[attr-defined,unused-ignore]


class _ShimWrapper(wrapt.FunctionWrapper):
    __bound_function_wrapper__ = _BoundShimWrapper

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Pickle by reference, like the module-level function it stands in for (found again by name on load).
        home = getattr(self, "_self_home", None)
        qualname: str = self.__qualname__  # type: ignore[attr-defined,unused-ignore]  # proxied from the wrapped function
        if home is None or _lookup(self.__module__, qualname) is self:
            return qualname
        # A re-exported name we wrapped where it is used (e.g. ray.actor's copy of a ray._private.utils function):
        # "getattr(<that module>, name)". The module travels as import_module(name), so unpickling needs no nrl_shim.
        return getattr, (_ModuleByName(home), self.__name__)  # type: ignore[attr-defined,unused-ignore]


class _ModuleByName:
    """Pickles as importlib.import_module(name): only its reduce value is stored, not this class."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[Callable[[str], Any], tuple[str]]:
        import importlib

        return importlib.import_module, (self.name,)


def _lookup(module_name: str, qualname: str) -> Any:
    obj: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _defined_on(owner: Any, name: str) -> Any:
    # The raw attribute (classmethod/staticmethod objects included), looked up along the MRO for classes.
    for namespace in getattr(owner, "__mro__", (owner,)):
        if name in vars(namespace):
            return vars(namespace)[name]
    raise AttributeError(f"{getattr(owner, '__name__', owner)!s} has no attribute {name!r}")


def _our_layer(obj: Any, quirk_id: str) -> _Layer | None:
    """Our layer for quirk_id anywhere in obj's chain of wrappers, or None."""
    seen = set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        layer = getattr(obj, "_self_wrapper", None)
        if isinstance(layer, _Layer) and layer.quirk_id == quirk_id:
            return layer
        obj = getattr(obj, "__wrapped__", None)
    return None


def wrap(owner: Any, name: str, wrapper: Wrapper, quirk_id: str) -> None:
    """Wrap owner.name (a function, method, classmethod or staticmethod) with wrapper(wrapped, instance, args, kwargs).

    Idempotent per quirk id: wrapping again keeps one layer and makes `wrapper` the one it calls. Raises AttributeError when the target is missing, which activation turns into a skip.
    """
    layer = _our_layer(_defined_on(owner, name), quirk_id)
    if layer is not None:
        layer.wrapper, layer.enabled = wrapper, True  # re-activation: the new settings' wrapper takes over
        return
    inherited = isinstance(owner, type) and name not in vars(owner)
    shim = wrapt.wrap_object(owner, name, _ShimWrapper, (_Layer(quirk_id, wrapper),), {})
    # A method a subclass inherits (DummyModelLoader.load_model): our layer sits on the subclass only, and unwrap
    # deletes it again rather than leaving a copy of the base's function behind.
    shim._self_inherited = inherited
    if isinstance(owner, types.ModuleType):
        shim._self_home = owner.__name__  # where this wrapper lives, for pickling re-exported names


def unwrap(owner: Any, name: str, quirk_id: str) -> None:
    """Remove our layer for quirk_id from owner.name; a pass-through stays if another tool wrapped over it."""
    try:
        top = vars(owner).get(name)
    except TypeError:
        return
    if top is None:
        return
    layer = _our_layer(top, quirk_id)
    if layer is None:
        return
    layer.enabled = False  # also for copies bound elsewhere (`from m import f` taken while we were on)
    if getattr(top, "_self_wrapper", None) is layer:
        if getattr(top, "_self_inherited", False):
            delattr(owner, name)
        else:
            setattr(owner, name, top.__wrapped__)
    else:
        layer.enabled = False


def is_wrapped(owner: Any, name: str, quirk_id: str) -> bool:
    """True when owner.name carries an enabled layer of quirk_id (for doctor and tests)."""
    try:
        layer = _our_layer(_defined_on(owner, name), quirk_id)
    except AttributeError:
        return False
    return layer is not None and layer.enabled


def rebind(modules: list[Any], name: str, old: Any, new: Any) -> None:
    """Point `modules`' own copies of `name` (taken by `from x import name`, e.g. a package re-export imported before
    activation) from `old` to `new`. Only copies that still hold `old` are touched, never a user's replacement;
    `__dict__` is read directly, so lazy modules (transformers) import nothing."""
    for module in modules:
        if module is not None and getattr(module, "__dict__", {}).get(name) is old:
            setattr(module, name, new)
