"""wrapt-based wrapping that stays correct when other tools wrap the same function (ddtrace, OTel, a profiler).

Each layer we add is marked with its quirk id, so wrap() is idempotent and unwrap() removes exactly our layer.
If another wrapper was stacked over ours, removing ours would need rewriting theirs, so unwrap() instead turns our
layer into a pass-through and a later wrap() turns it back on: either way the fix is applied exactly once.

wrap_instance()/unwrap_instance() do the same for a method of one object (a model's load_weights): the layers live in
the object's own __dict__, other objects of its class are untouched, and once every layer there is off the object's own
attribute is gone again (its class's method shows through) or, if it had one before, that one is back.
"""

from __future__ import annotations

import copy
import inspect
import sys
import types
from collections.abc import Callable, Iterator
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


def layers(obj: Any) -> Iterator[_Layer]:
    """The shim's layers (any quirk's, enabled or not) a call of obj goes through, outermost first: its chain of
    wrappers, continued into the base class's current method where a layer sits on an inherited one (see wrap)."""
    seen = set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        layer = getattr(obj, "_self_wrapper", None)
        if isinstance(layer, _Layer):
            yield layer
        base_of = getattr(obj, "_self_base_of", None)
        obj = _base_method(*base_of) if base_of is not None else getattr(obj, "__wrapped__", None)


def _our_layer(obj: Any, quirk_id: str) -> _Layer | None:
    """Our layer for quirk_id anywhere in obj's chain of wrappers, or None."""
    return next((layer for layer in layers(obj) if layer.quirk_id == quirk_id), None)


def wrap(owner: Any, name: str, wrapper: Wrapper, quirk_id: str) -> None:
    """Wrap owner.name (a function, method, classmethod or staticmethod) with wrapper(wrapped, instance, args, kwargs).

    Idempotent per quirk id: wrapping again keeps one layer and makes `wrapper` the one it calls. Raises AttributeError when the target is missing, which activation turns into a skip.
    """
    layer = _our_layer(_defined_on(owner, name), quirk_id)
    if layer is not None:
        layer.wrapper, layer.enabled = wrapper, True  # re-activation: the new settings' wrapper takes over
        return
    inherited = isinstance(owner, type) and name not in vars(owner)
    if inherited and isinstance(_defined_on(owner, name), types.FunctionType):
        # Our layer on a subclass wraps a call to the base's method as it is *at call time*, not the function found
        # now: another fix's layer on the base, added or taken off later (deactivate, then activate in registry
        # order), is then never skipped or kept by a stale copy.
        setattr(owner, name, _call_base(owner, name))
    shim = wrapt.wrap_object(owner, name, _ShimWrapper, (_Layer(quirk_id, wrapper),), {})
    # A method a subclass inherits (DummyModelLoader.load_model): our layer sits on the subclass only, and unwrap
    # deletes it again rather than leaving a copy of the base's function behind.
    shim._self_inherited = inherited
    if isinstance(owner, types.ModuleType):
        shim._self_home = owner.__name__  # where this wrapper lives, for pickling re-exported names


def _call_base(owner: type, name: str) -> Callable[..., Any]:
    """A method of `owner` that calls `name` of owner's base classes, looked up at each call (see wrap)."""
    import functools

    found = _defined_on(owner, name)

    @functools.wraps(found)
    def call_base(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(super(owner, self), name)(*args, **kwargs)

    # No fixed __wrapped__ (it would be the copy this avoids): _our_layer follows _self_base_of to the base's current
    # method; the signature stays the base's for introspection (REQUIRES' parameter checks).
    del call_base.__wrapped__
    call_base._self_base_of = (owner, name)  # type: ignore[attr-defined]
    try:
        call_base.__signature__ = inspect.signature(found)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    return call_base


def _base_method(owner: type, name: str) -> Any:
    for namespace in owner.__mro__[1:]:
        if name in vars(namespace):
            return vars(namespace)[name]
    return None


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


class _InstanceShimWrapper(wrapt.FunctionWrapper):
    """One quirk's layer over a method of one object, stored in that object's __dict__ (never bound again: instance
    attributes are not descriptors). `_self_restore` is what the object held before our first layer there: the object's
    own attribute, or _CLASS_METHOD (its class's method, a bound copy of which this wraps), or None on a layer that
    sits over another of ours."""

    _self_restore: Any

    @property
    def _self_layer(self) -> _Layer:
        layer: _Layer = self._self_wrapper  # type: ignore[assignment,unused-ignore]
        return layer

    def __reduce_ex__(self, protocol: Any) -> Any:
        # A copy of the object is watched by no quirk: it gets what the object held before our layers.
        return self.__wrapped__.__reduce_ex__(protocol)  # type: ignore[attr-defined,unused-ignore]

    def __copy__(self) -> Any:
        return self.__wrapped__  # type: ignore[attr-defined,unused-ignore]

    def __deepcopy__(self, memo: dict) -> Any:
        return copy.deepcopy(self.__wrapped__, memo)  # type: ignore[attr-defined,unused-ignore]


_CLASS_METHOD = object()  # _self_restore: the object had no attribute of its own


def _instance_layers(top: Any) -> list[_InstanceShimWrapper]:
    """Our instance layers in the chain under (and including) `top`, outermost first; a foreign wrapper over or
    between ours is looked through (its __wrapped__). Stops at our bottom layer: below it is the object's original."""
    layers, seen = [], set()
    while top is not None and id(top) not in seen:
        seen.add(id(top))
        if isinstance(top, _InstanceShimWrapper):
            layers.append(top)
            if top._self_restore is not None:
                break
        top = getattr(top, "__wrapped__", None)
    return layers


def _instance_layer(obj: Any, name: str, quirk_id: str) -> _InstanceShimWrapper | None:
    own = getattr(obj, "__dict__", {}).get(name)
    for wrapper in _instance_layers(own):
        if wrapper._self_layer.quirk_id == quirk_id:
            return wrapper
    return None


def wrap_instance(obj: Any, name: str, wrapper: Wrapper, quirk_id: str) -> None:
    """Wrap the method `name` of this one object (not its class) with wrapper(wrapped, instance, args, kwargs).

    Same rules as wrap(): idempotent per quirk id (wrapping again keeps one layer, enables it and makes `wrapper` the
    one it calls); each quirk's layer is its own, whatever order they are added and removed in. Raises AttributeError
    when the object has no such attribute, TypeError when it has no __dict__ to hold the layer.
    """
    found = _instance_layer(obj, name, quirk_id)
    if found is not None:
        found._self_layer.wrapper, found._self_layer.enabled = wrapper, True
        return
    namespace = vars(obj)
    current = getattr(obj, name)  # the object's own attribute (maybe our layers) or its class's method, bound
    # What unwrap_instance puts back once every layer is off; None on a layer over ours (the bottom one knows).
    restore: Any = _CLASS_METHOD
    if name in namespace:
        restore = None if _instance_layers(namespace[name]) else namespace[name]
    layer = _InstanceShimWrapper(current, _Layer(quirk_id, wrapper))
    layer._self_restore = restore
    namespace[name] = layer


def unwrap_instance(obj: Any, name: str, quirk_id: str) -> None:
    """Remove quirk_id's layer from obj.name; the other quirks' layers stay as they are (enabled or not).

    A layer with an enabled one or a foreign wrapper over it becomes a pass-through (a later wrap_instance enables it
    again); every disabled layer of ours on top comes off, and when none is left the object's own attribute is what it
    was before our first layer: none (its class's method shows through) or the one it had.
    """
    found = _instance_layer(obj, name, quirk_id)
    if found is None:
        return
    found._self_layer.enabled = False  # also for a copy someone took while it was on (`fn = model.load_weights`)
    namespace = vars(obj)
    top = namespace[name]
    while isinstance(top, _InstanceShimWrapper) and not top._self_layer.enabled:
        if top._self_restore is _CLASS_METHOD:
            del namespace[name]
            return
        if top._self_restore is not None:
            namespace[name] = top._self_restore
            return
        top = top.__wrapped__
    namespace[name] = top


def is_instance_wrapped(obj: Any, name: str, quirk_id: str) -> bool:
    """True when obj.name carries an enabled instance layer of quirk_id (for quirks' bookkeeping and tests)."""
    found = _instance_layer(obj, name, quirk_id)
    return found is not None and found._self_layer.enabled
