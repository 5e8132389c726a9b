"""Interpreter start-up with NRL_SHIM=1: arm the shim, and load it when the process first has work for it.

Most interpreters of a job never import a quirk's target (compile and tokenizer workers, shell-outs, the CLI's own
helpers), yet every one of them starts with the shim. So when the .pth or a sitecustomize imports nrl_shim, this
module reads only the plan the plugin index keeps (nrl_shim.plugins: every quirk's target modules, built-in or plugin,
computed when the index was written) and puts two watchers on sys.meta_path: one first, for imports of those modules, one last, for importlib.metadata lookups a quirk's
setup() waits for (SETUP_DISTRIBUTION). The first hit completes the activation (nrl_shim.activation: settings, the
registry, setups, patches), whose import finder then takes the first watcher's place; the target being imported is
patched as if the shim had been active all along. So does any call that needs the full state (activate(),
active_settings()).

Where arming could differ from activating at once, start-up activates at once, as an explicit `import nrl_shim` does:
an NRL_* setting or NRL_SHIM_PLUGINS is set (settings are validated at start-up: a bad value ends the process with one
line), the plugin index is stale (this start scans) or holds a plugin that failed, clashes or is misnamed (activation
says so), or a quirk's setup() has work in this process now (e.g. vllm-eager-recipes with `--config`) or in every
process.

Stdlib only (os, sys, _thread): this module is on every interpreter's start-up path.
"""

import _thread
import os
import sys

TYPE_CHECKING = False  # not typing's: start-up path
if TYPE_CHECKING:
    from collections.abc import Callable
    from importlib.machinery import ModuleSpec
    from types import FrameType
    from typing import Any

# NRL_SHIM's values as nrl_shim.settings.parse_bool reads them (not imported: start-up path).
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class _Armed:
    how: "str | None" = None  # what armed the shim (the DEBUG line of the completed activation says it)
    complete: "Callable[[str], object] | None" = None  # activates (activation calls hand_over with its finder)
    finder: "Any" = None  # that finder, once activation took over
    watcher: "Watcher | None" = None  # the import watcher, until then
    firing: "set[int]" = set()  # threads completing the activation right now


class Watcher:
    """A sys.meta_path entry that finds nothing: it completes the activation at the first import of one of `modules`
    or the first importlib.metadata lookup of one of `distributions` (lower case), then hands over."""

    def __init__(self, modules: "frozenset[str]", distributions: "frozenset[str]") -> None:
        self.modules, self.distributions = modules, distributions

    def find_spec(self, fullname: str, path: "Any" = None, target: "Any" = None) -> "ModuleSpec | None":
        if fullname not in self.modules:
            return None
        finder = complete(f"the import of {fullname}")
        return finder.find_spec(fullname, path, target) if finder is not None else None

    def find_distributions(self, context: "Any" = None) -> "list[Any]":
        name = getattr(context, "name", None)
        if isinstance(name, str) and name.lower() in self.distributions:
            # The setup() that waited for this lookup appends its own finder now, after this one: it answers.
            complete(f"the lookup of distribution {name!r}")
        return []

    def invalidate_caches(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<nrl_shim start-up watcher: {len(self.modules)} modules, distributions {sorted(self.distributions)}>"


def is_armed() -> bool:
    return _Armed.complete is not None


def complete(why: str) -> "Any":
    """Complete an armed activation (idempotent, any thread); the import finder that took over, or None when not armed
    or this thread is completing it already (activate() then patches what was imported meanwhile)."""
    done = _Armed.complete
    if _Armed.finder is not None or done is None:
        return _Armed.finder
    thread = _thread.get_ident()
    if thread in _Armed.firing:
        return None
    _Armed.firing.add(thread)
    try:
        done(f"{_Armed.how}, completed at {why}")  # activation.activate is thread-safe: racing threads get one
    finally:
        _Armed.firing.discard(thread)
    return _Armed.finder


def hand_over(finder: "Any") -> bool:
    """Activation's import finder takes the import watcher's place (in place: the import system may be iterating
    sys.meta_path right now). False when no watcher is there."""
    for i, entry in enumerate(sys.meta_path):
        if entry is _Armed.watcher:
            sys.meta_path[i] = finder
            _Armed.watcher = None
            _Armed.finder = finder
            return True
    return False


def disarm() -> None:
    """Remove the watchers (deactivation)."""
    sys.meta_path[:] = [entry for entry in sys.meta_path if not isinstance(entry, Watcher)]
    _Armed.how = _Armed.complete = _Armed.finder = _Armed.watcher = None


def arm(how: str, complete: "Callable[[str], object]") -> bool:
    """Arm the shim instead of activating it (see above); False when start-up must activate at once."""
    from .plugins import start_up_plan

    environ = os.environ
    if environ.get("NRL_SHIM", "").strip().lower() not in TRUE:
        return False  # a value settings rejects: activation says so now
    plan = start_up_plan()
    if plan is None:
        return False
    modules, distributions, variables, options = plan
    if any(environ.get(name, "").strip() for name in variables):
        return False  # settings to validate now (an empty one means its default, as settings reads it)
    argv = getattr(sys, "argv", None) or ()
    if any(arg == option or arg.startswith(option + "=") for option in options for arg in argv):
        return False  # a setup() has work in this process now
    _Armed.how, _Armed.complete, _Armed.finder = how, complete, None
    _Armed.watcher = Watcher(modules, frozenset())
    sys.meta_path.insert(0, _Armed.watcher)
    if distributions:
        sys.meta_path.append(Watcher(frozenset(), distributions))  # last, like the finders it defers
    return True


def imported_by_site() -> "str | None":
    """How the interpreter's start-up imported nrl_shim (NRL_SHIM=1 via the .pth, or a sitecustomize), or None."""
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if name == "site":
            return "NRL_SHIM=1 at interpreter start-up (nrl_shim.pth)"
        if name == "sitecustomize":
            return f"NRL_SHIM=1 at interpreter start-up ({frame.f_globals.get('__file__')})"
        frame = frame.f_back
    return None
