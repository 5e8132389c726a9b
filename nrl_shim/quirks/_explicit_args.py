"""Which arguments of an engine's argument dataclass did its caller choose? One tracker per library (vLLM's EngineArgs,
SGLang's ServerArgs), shared by every fix of that library that keeps an explicit choice and changes only a default.

"Chosen" is read from the call, never from the field (a dataclass default equals an explicit value):
- a keyword or positional argument of the dataclass's constructor (positional ones are its fields in order);
- the names given to a front door that always passes the field on (vLLM's `LLM(seed=0, ...)`: the front door's
  caller chose what it named, the dataclass receives every parameter of it);
- from a command line (`from_cli_args(namespace)`, which passes every field): the options its argument list names,
  read where the library's parser parsed it (`parse_args`), else the process's own `sys.argv`. A config-file option
  (`--config serve.yaml`) may set any field: every field counts as chosen then.

The result is a frozenset of field names on the instance (`explicit(instance)`); None for an instance built before
the tracker was on. The library's folder wires the tracker to its classes (nrl_shim/quirks/vllm/_engine_args.py).
Not a quirk; imports only the stdlib at top level.
"""

from __future__ import annotations

import contextvars
import dataclasses
import sys
import weakref
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

ATTRIBUTE = "_nrl_shim_explicit_args"  # on an instance: frozenset of the field names its caller chose


def explicit(instance: Any) -> frozenset[str] | None:
    """The field names the caller of `instance` chose, or None when it was built before the tracker was on."""
    try:
        return vars(instance).get(ATTRIBUTE)
    except TypeError:  # no __dict__
        return None


def options_named(
    argv: Iterable[object], fields: Iterable[str], config_options: Iterable[str] = ("--config",)
) -> frozenset[str]:
    """The fields that the argument list `argv` names as `--a-field`, `--a_field`, `--a-field=...` or (a boolean's
    negation) `--no-a-field`; every field when it names one of `config_options` (a file that may set any of them)."""
    fields = frozenset(fields)
    configs = tuple(config_options)
    named = set()
    for arg in map(str, argv):
        if not arg.startswith("--"):
            continue
        option = arg.split("=", 1)[0]
        if option in configs:
            return fields
        name = option[2:].replace("-", "_")
        if name in fields:
            named.add(name)
        elif name.startswith("no_") and name[3:] in fields:
            named.add(name[3:])
    return frozenset(named)


def field_names(instance: Any) -> list[str]:
    """The fields of an argument record: a dataclass's, or a msgspec Struct's (SGLang's ServerArgs from 0.5.20)."""
    if dataclasses.is_dataclass(instance):
        return [field.name for field in dataclasses.fields(instance)]
    return list(getattr(type(instance), "__struct_fields__", ()))


class ExplicitArgs:
    """The tracker of one library: wrappers that record the chosen fields, and its wrapt layers.

    Several fixes use it at once and each is activated and deactivated on its own. One layer per wrapped callable,
    under `layer_id` (not a quirk's id), counted by the fixes using it: a second fix adds no second layer (the record
    is the same), and the layer goes only when the last fix using it does. Idempotent per fix, as patch() must be.
    """

    def __init__(self, layer_id: str, config_options: Iterable[str] = ("--config",)) -> None:
        self.layer_id = layer_id
        self.config_options = tuple(config_options)
        self._users: dict[tuple[Any, str], set[str]] = {}  # (owner, attribute name) -> ids of the fixes using it
        # id(namespace) -> (a weak reference to it, the argument list it was parsed from). Kept off the Namespace
        # itself: the library prints and copies its attributes. An entry goes with its namespace.
        self._parsed_from: dict[int, tuple[weakref.ref, tuple[str, ...]]] = {}
        # While a front door (LLM(...)) runs: the names its caller gave; the dataclass it builds counts those.
        self._front_door: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar(
            f"nrl_shim_{layer_id}_front_door", default=None
        )

    # --- layers, counted by fix ---

    def attach(self, owner: Any, name: str, wrapper: Callable[..., Any], quirk_id: str) -> None:
        from nrl_shim.patching import wrap

        users = self._users.setdefault((owner, name), set())
        if not users:
            wrap(owner, name, wrapper, self.layer_id)
        users.add(quirk_id)

    def detach(self, owner: Any, name: str, quirk_id: str) -> None:
        from nrl_shim.patching import unwrap

        users = self._users.get((owner, name))
        if not users or quirk_id not in users:
            return
        users.discard(quirk_id)
        if not users:
            del self._users[(owner, name)]
            unwrap(owner, name, self.layer_id)

    # --- wrappers (wrapt's signature) ---

    def init_wrapper(self, wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        """The dataclass's __init__: the fields given to the call (or to the front door that built it)."""
        result = wrapped(*args, **kwargs)
        if instance is not None and ATTRIBUTE not in vars(instance):  # a subclass's __init__ calling its base's
            given = self._front_door.get()
            if given is None:
                positional = [field.name for field in dataclasses.fields(instance)][: len(args)]
                given = frozenset(positional) | frozenset(kwargs)
            vars(instance)[ATTRIBUTE] = given
        return result

    def front_door_wrapper(self, wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        """A constructor that passes every parameter of its own on to the dataclass (vLLM's LLM.__init__)."""
        import inspect

        try:
            signature = inspect.signature(wrapped)
            bound = signature.bind_partial(*args, **kwargs).arguments
            given = set(bound)
            for parameter in signature.parameters.values():
                if parameter.kind is inspect.Parameter.VAR_KEYWORD and parameter.name in bound:
                    given.discard(parameter.name)
                    given.update(bound[parameter.name])
        except (TypeError, ValueError):
            given = set(kwargs)
        token = self._front_door.set(frozenset(given))
        try:
            return wrapped(*args, **kwargs)
        finally:
            self._front_door.reset(token)

    def parse_args_wrapper(self, wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        """The library's argument parser: remember the argument list each namespace came from."""
        namespace = wrapped(*args, **kwargs)
        argv = args[0] if args else kwargs.get("args")
        argv = sys.argv[1:] if argv is None else argv
        key = id(namespace)
        parsed_from = self._parsed_from

        def forget(_reference: object) -> None:
            parsed_from.pop(key, None)

        try:
            parsed_from[key] = (weakref.ref(namespace, forget), tuple(map(str, argv)))
        except TypeError:  # not a weak-referenceable namespace: from_cli_args falls back to sys.argv
            pass
        return namespace

    def from_cli_args_wrapper(self, wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        """`from_cli_args(namespace)`: it passes every field to the constructor, so what was chosen is what the
        command line names."""
        built = wrapped(*args, **kwargs)
        namespace = args[0] if args else kwargs.get("args")
        fields = [field.name for field in dataclasses.fields(built)]
        vars(built)[ATTRIBUTE] = options_named(self.argv_of(namespace), fields, self.config_options)
        return built

    def parsed_wrapper(self, wrapped: Callable[..., Any], instance: Any, args: tuple, kwargs: dict) -> Any:
        """A function that parses an argument list and builds the record from it (SGLang's
        `prepare_server_args(argv)`): what was chosen is what that list names."""
        built = wrapped(*args, **kwargs)
        argv = args[0] if args else kwargs.get("argv")
        argv = sys.argv[1:] if argv is None else argv
        try:
            vars(built)[ATTRIBUTE] = options_named(argv, field_names(built), self.config_options)
        except TypeError:  # a record without a __dict__: nothing known about it
            pass
        return built

    def argv_of(self, namespace: object) -> tuple[str, ...]:
        entry = self._parsed_from.get(id(namespace))
        if entry is not None and entry[0]() is namespace:
            return entry[1]
        return tuple(sys.argv[1:])  # parsed by another parser: the process's own command line


Patch = Callable[[ModuleType, Any], None]
Unpatch = Callable[[ModuleType], None]
Track = Callable[[ModuleType, str, bool], None]


def tracker_targets(
    tracked: dict[str, Track], quirk_id: str, own: dict[str, tuple[Patch, Unpatch]] | None = None
) -> dict[str, tuple[Patch, Unpatch]]:
    """TARGETS for a fix of `quirk_id` that reads a library's tracker: {module name: (patch, unpatch)} tracking on the
    modules in `tracked` ({module name: track(module, quirk_id, attach)}), followed on each module by the fix's `own`
    handlers for it (and its own modules): on a module in both, the tracker's layers go on first."""
    own = dict(own or {})
    result: dict[str, tuple[Patch, Unpatch]] = {}
    for name in (*tracked, *(name for name in own if name not in tracked)):
        result[name] = _handlers(quirk_id, tracked.get(name), own.get(name))
    return result


def _handlers(quirk_id: str, track: Track | None, own: tuple[Patch, Unpatch] | None) -> tuple[Patch, Unpatch]:
    def patch(module: ModuleType, settings: Any) -> None:
        if track is not None:
            track(module, quirk_id, True)
        if own is not None:
            own[0](module, settings)

    def unpatch(module: ModuleType) -> None:
        if own is not None:
            own[1](module)
        if track is not None:
            track(module, quirk_id, False)

    return patch, unpatch
