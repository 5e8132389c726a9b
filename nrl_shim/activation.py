"""Activation: settings -> registry -> patches applied when each target module is imported.

Start-up path (NRL_SHIM=1, no target imported) is stdlib only: a tiny meta-path finder watches for target imports;
wrapt (~59 ms to import) is loaded by the first patch() that needs it. Targets imported before activation are
patched by activate() itself.
"""

import _thread  # not `threading`: it drags functools/collections into every interpreter start-up
import os
import sys

from . import _startup, registry

TYPE_CHECKING = False  # not typing's: `typing` is not worth importing at every interpreter start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

    from .registry import Quirk, Release, Verdict
    from .settings import Settings


class _State:
    active = False
    settings: "Settings | None" = None
    exported_nrl_shim = False  # we set NRL_SHIM=1 ourselves (so children activate) and must remove it on deactivate
    targets: "frozenset[str]" = frozenset()  # module names of the enabled quirks' targets
    pre_targets: "frozenset[str]" = frozenset()  # those with a PRE_TARGETS hook (run before the module executes)
    patched: "set[tuple[str, str]]" = set()  # (quirk id, target module name) currently patched
    applying: "set[tuple[str, str]]" = set()  # (quirk id, target module name) being patched by some thread right now
    releases: "dict[str, Release]" = {}  # quirk id -> registry.release_of(), on its first target import
    withdrawn: "dict[str, str]" = {}  # quirk id -> why it was withdrawn (lacking what it needs on an unverified release)
    verdicts: "dict[str, Verdict]" = {}  # quirk id -> registry.verdict() at its latest target import (doctor's own)
    skipped: "set[str]" = set()  # quirk ids already warned about


_lock = _thread.RLock()


def active_settings() -> "Settings | None":
    """The active Settings, or None when the shim is not active."""
    if not _State.active and _startup.is_armed():
        _startup.complete("a call of nrl_shim.active_settings()")
    return _State.settings if _State.active else None


def is_active() -> bool:
    """Whether the shim is active in this process (at interpreter start-up it may be armed only: it loads at the first
    import of a target, nrl_shim/_startup.py)."""
    return _State.active or _startup.is_armed()


def verdicts() -> "dict[str, Verdict]":
    """The verdict of each fix a target of which was imported in this process (registry.verdict, as doctor's)."""
    return dict(_State.verdicts)


def patched() -> "list[tuple[str, str]]":
    """(quirk id, module name) pairs patched in this process, for doctor and tests."""
    return sorted(_State.patched)


def activate(settings: "Settings | None" = None, how: str = "nrl_shim.activate()") -> "Settings":
    """Activate the shim in this process (idempotent) and return the effective Settings.

    Calling it again re-applies fixes that were lost (e.g. after importlib.reload of a target module).
    `how` names the trigger in the DEBUG line that says the shim is active.
    """
    announce = False
    # The registry first, outside _lock: reading it the first time imports the plugin quirk modules (see the locking
    # rule below); a clash between plugins raises PluginError here.
    registry.quirk_ids()
    with _lock:
        if not _State.active:
            announce = True
            settings = settings or registry.load_settings()
            if settings.strict:
                _stop_if_any_fix_out_of_range(settings)
            if os.environ.get("NRL_SHIM") != "1":
                os.environ["NRL_SHIM"] = "1"  # children (spawn, subprocess, Ray workers) inherit it and activate too
                _State.exported_nrl_shim = True
            _State.settings, _State.active = settings, True
            _State.targets = registry.targets(settings)
            _State.pre_targets = registry.pre_targets(settings)
            for quirk in registry.with_setup(settings):  # the only quirk modules imported here (and plugins')
                if quirk.setup:
                    _setup(quirk, settings)
            if not any(isinstance(f, _TargetFinder) for f in sys.meta_path):
                finder = _TargetFinder()
                if not _startup.hand_over(finder):  # an armed start-up's import watcher: replaced in place
                    sys.meta_path.insert(0, finder)
        current = _State.settings
    assert current is not None  # set above, under the lock
    if "nrl_shim.report" in sys.modules:
        _report().configure(current.log_level)  # the level follows every activation, not only the first
    if announce and current.log_level <= 10:  # checked first: `logging` stays off the start-up path otherwise
        _announce(current, how)
    imported = {name for name in _State.targets if name in sys.modules}  # before activation, or reloaded since
    if imported:  # Quirk objects (and their modules) only for targets already here: none at interpreter start-up
        for quirk in _enabled_quirks():
            for name in quirk.targets:
                if name in imported:
                    _apply(quirk, sys.modules[name])
    return current


def _report() -> "ModuleType":
    """The report module, its logger at the active level. Imported only when something is logged or patched: `logging`
    costs start-up time in every interpreter that never imports a target."""
    from . import report

    settings = _State.settings
    if settings is not None:
        report.configure(settings.log_level)
    return report


def _announce(current: "Settings", how: str) -> None:
    from . import __version__

    enabled = [quirk_id for quirk_id in registry.quirk_ids() if current.is_enabled(quirk_id)]
    _report().logger().debug(
        "active: nrl-shim %s in pid %d (%s), activated by %s; fixes enabled: %s",
        __version__,
        os.getpid(),
        sys.executable,
        how,
        ", ".join(enabled) or "none",
    )


def deactivate() -> None:
    """Undo everything activate() did in this process: patches, exported variables, the import watcher."""
    with _lock:
        _startup.disarm()
        if not _State.active:
            return
        quirks, done = _enabled_quirks(), sorted(_State.patched)
        _State.active = False  # from here on, hooks that fire do nothing
        _State.patched.clear()
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TargetFinder)]
        if _State.exported_nrl_shim:
            os.environ.pop("NRL_SHIM", None)
            _State.exported_nrl_shim = False
        _State.settings = None
    for quirk_id, name in done:
        module = sys.modules.get(name)
        if module is not None:
            registry.get(quirk_id).unpatch(module)
    for quirk in quirks:
        module = quirk.loaded()  # a quirk module never imported had nothing set up (setups import theirs)
        teardown = getattr(module, "teardown", None) if module is not None else None
        if teardown:
            teardown()


def activate_on_import(by_site: "str | None") -> None:
    """`import nrl_shim` activates (nrl_shim/__init__.py decides when). Bad settings at interpreter start-up (`by_site`:
    the .pth or a sitecustomize) end the process with one clear line instead of a traceback inside site.py."""
    try:
        activate(how=by_site or "import nrl_shim")
    except Exception as err:
        from .errors import ShimError  # here: the errors module is not worth loading at every start-up

        if not by_site or not isinstance(err, ShimError):
            raise
        sys.stderr.write(f"nrl-shim: error: {err}\n")
        sys.stderr.flush()
        os._exit(2)  # SystemExit would be swallowed or turned into a fatal init error by site.py


def _enabled_quirks() -> "list[Quirk]":
    if _State.settings is None:
        return []  # deactivated meanwhile (another thread)
    return [q for q in registry.quirks() if _State.settings.is_enabled(q.id)]


class _TargetFinder:
    """Post-import hooks for the quirks' target modules: finds the real spec and wraps its loader so that _on_import
    runs right after the module executed.

    Not wrapt's post-import hooks, on purpose: wrapt's finder calls importlib.util.find_spec, which imports the parent
    package while the import system holds its global lock; when another thread is mid-way through importing that
    parent, the two threads deadlock (seen here with 8 threads importing vLLM/torch/transformers targets). The import
    system already hands us `path` (the parent's __path__), so we just ask the other finders with it.
    """

    def find_spec(self, fullname: str, path: "Any" = None, target: "Any" = None) -> "ModuleSpec | None":
        if fullname not in _State.targets or not _State.active:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _TargetFinder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _NotifyingLoader(spec.loader)  # type: ignore[assignment]
                return spec
        return None

    def invalidate_caches(self) -> None:
        pass


class _NotifyingLoader:
    """The real loader, plus a call to _on_import once the module has executed."""

    def __init__(self, loader: "Any") -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> "Any":  # get_code, get_source, is_package, get_resource_reader ...
        return getattr(self.loader, name)

    def create_module(self, spec: "ModuleSpec") -> "ModuleType | None":
        return self.loader.create_module(spec)

    def exec_module(self, module: "ModuleType") -> None:
        # Put the real loader back first, so reload(), inspect and importlib.resources see the module as usual.
        module.__loader__ = self.loader
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self.loader
        undo = _before_exec(module) if module.__name__ in _State.pre_targets else ()
        try:
            self.loader.exec_module(module)
        finally:
            for step in undo:
                step()
        _on_import(module)


# Locking rule: _lock guards _State only and is never held across an import or a patch() call. Finders run under the
# interpreter's global import lock, and patch() may import; holding _lock across either can deadlock threads that
# import targets concurrently.


def _on_import(module: "ModuleType") -> None:
    with _lock:
        if not _State.active:
            return
        quirks = [q for q in _enabled_quirks() if module.__name__ in q.targets]
    for quirk in quirks:
        _apply(quirk, module)


def _before_exec(module: "ModuleType") -> "list[Callable[[], object]]":
    """Run the PRE_TARGETS hooks of the enabled quirks for `module`, about to execute; return what to run after."""
    settings = _State.settings
    if settings is None or not _State.active:
        return []
    undo = []
    for quirk in registry.pre_quirks(module.__name__, settings):
        ran, after = _gated(quirk, module, quirk.module.PRE_TARGETS[module.__name__], "prepare")
        if ran and after is not None:
            undo.append(after)
    return undo


def _apply(quirk: "Quirk", module: "ModuleType") -> None:
    key = (quirk.id, module.__name__)
    with _lock:
        if not _State.active or key in _State.applying:
            return  # another thread is applying this very fix right now
        _State.applying.add(key)
    try:
        ran, _ = _gated(quirk, module, quirk.patch, "patch")
        if ran:
            with _lock:
                _State.patched.add(key)
    finally:
        with _lock:
            _State.applying.discard(key)


def _gated(
    quirk: "Quirk", module: "ModuleType", step: "Callable[[ModuleType, Settings], Any]", verb: str
) -> "tuple[bool, Any]":
    """The one gate sequence around a fix's step at `module` (verb "prepare": its PRE_TARGETS hook, before the module
    executes; "patch": patch(), after): the fix's verdict (registry.verdict: versions, then, on a release nobody
    verified, the names it relies on in the target modules executed so far), then the step; any failure but a
    ShimError is a skip, never the user's import failing. Returns (whether the step ran, what it returned)."""
    settings = _State.settings
    if settings is None:
        return False, None  # deactivated meanwhile
    # The fix's other target modules that finished executing: one still executing (it imported this one on its way)
    # has only part of its names yet; importlib marks it so on its spec while it runs.
    executed = {
        name: loaded
        for name in quirk.targets
        if name != module.__name__
        and (loaded := sys.modules.get(name)) is not None
        and not getattr(getattr(loaded, "__spec__", None), "_initializing", False)
    }
    if verb == "patch":  # before it executes, its namespace is empty: nothing to check there yet
        executed[module.__name__] = module
    release = _State.releases.get(quirk.id)
    if release is None:
        release = _State.releases.setdefault(quirk.id, registry.release_of(quirk))
    found = registry.verdict(quirk, settings, executed, release, _State.withdrawn.get(quirk.id))
    _State.verdicts[quirk.id] = found
    if found.state in registry.NOTHING_TO_FIX:
        # The library the fix is about is absent (e.g. torch-only user, transformers fix), has upstream's fix, or is a
        # release without the bug (AFFECTED): nothing to fix here.
        if verb == "patch":  # said once, after the import: not again before it
            if found.state == registry.NOT_AFFECTED:
                _report().unchanged(quirk.id, f"{quirk.library} release", found.reason, state=found.state)
            else:
                _report().logger().debug("[%s] not applicable: %s", quirk.id, found.reason)
        return False, None
    if found.state == registry.OUT_OF_RANGE and found.case:
        # The bug is here and the fix cannot reach it: named once now, and at the case itself (strict: an error then).
        _report()
        registry.note_gap(quirk, found.reason)
        if verb != "patch":
            return False, None
        try:
            guarded = quirk.guard_case(module, settings)
        except Exception as exc:  # never the user's import: the gap was named above
            _report().warn_once(
                quirk.id,
                f"case hook {module.__name__}",
                f"[{quirk.id}] {quirk.case} cannot be named when it happens: its hook on {module.__name__} failed: "
                f"{type(exc).__name__}: {exc}",
            )
            return False, None
        return guarded, None
    if not found.applied:  # out of range, or on a release nobody verified a fix whose names are gone: it does not guess
        if found.missing:
            _withdraw(quirk, found.reason)
        _skip(quirk, found.reason, found.state)
        return False, None
    if verb == "patch" and not quirk.patches(module.__name__):
        return False, None  # a CASE_TARGETS module only: its hook is for releases the fix does not reach
    _report()  # the quirk may log while acting: at the active level
    from .errors import ShimError

    try:
        result = step(module, settings)
    except ShimError:
        raise
    except Exception as exc:  # never break the user's import over a fix we could not apply
        _skip(quirk, f"could not {verb} {module.__name__}: {type(exc).__name__}: {exc}")
        return False, None
    if release[1]:
        _say_unverified(quirk, release[1])
    return True, result


def _withdraw(quirk: "Quirk", reason: str) -> None:
    """A fix found lacking at one of its targets acts at none: its targets patched already are unpatched, later ones
    are skipped (its verdict now says so)."""
    with _lock:
        _State.withdrawn[quirk.id] = reason
        done = [name for quirk_id, name in _State.patched if quirk_id == quirk.id]
        _State.patched.difference_update((quirk.id, name) for name in done)
    for name in done:
        module = sys.modules.get(name)
        if module is not None:
            quirk.unpatch(module)


def _say_unverified(quirk: "Quirk", why: str) -> None:
    """Once per process and fix: it acts on a release newer than those verified (its own checks passed)."""
    checked = f"{len(quirk.requires)} name(s) it relies on checked" if quirk.requires else "no names declared to check"
    _report().warn_once(
        quirk.id,
        "unverified",
        f"[{quirk.id}] acts on an unverified release: {why}; {checked}",
        kind="unverified",
        state=registry.UNVERIFIED,
    )


def _setup(quirk: "Quirk", settings: "Settings") -> None:
    """A quirk's setup() at activation: one that fails (a plugin's bug) is skipped like a patch that fails."""
    assert quirk.setup is not None
    try:
        quirk.setup(settings)
    except Exception as exc:
        from .errors import ShimError

        if isinstance(exc, ShimError):
            raise
        _skip(quirk, f"its setup() failed: {type(exc).__name__}: {exc}")


def _stop_if_any_fix_out_of_range(settings: "Settings") -> None:
    """Strict mode: a fix its installed library's version would skip stops the job here, at activation, with one line,
    in the first process that activates (its children have the same install). Left to the target's import, it would
    end whichever process imports it first: inside vLLM's model-registry subprocess on 0.9.1, behind vLLM's own errors.
    Not a release without the bug (outside AFFECTED: gate() says nothing to fix), nor a fix that names its CASE when
    it happens (strict raises then: a job that never meets the case runs)."""
    from .errors import QuirkSkippedError

    out = []
    for quirk in registry.quirks():
        found = registry.verdict(quirk, settings, release=_State.releases.get(quirk.id))
        # not installed, fixed upstream or not affected: nothing to fix, never an error; a CASE raises when it happens
        if found.state == registry.OUT_OF_RANGE and not found.case:
            out.append((quirk.id, found.reason))
    if out:
        skipped = "; ".join(f"[{quirk_id}] {reason}" for quirk_id, reason in out)
        ids = ",".join(quirk_id for quirk_id, _ in out)
        raise QuirkSkippedError(
            f"fixes would be skipped for their version: {skipped} (NRL_SHIM_STRICT=1; to go on without them set "
            f"NRL_SHIM_DISABLE={ids})"
        )


def _skip(quirk: "Quirk", reason: str, state: str = "skipped") -> None:
    """The fix does not act in this process (`state`: its verdict; a step that failed is `skipped`): one WARNING, in
    strict mode QuirkSkippedError."""
    message = f"[{quirk.id}] fix skipped: {reason}"
    if _State.settings is not None and _State.settings.strict:
        from .errors import QuirkSkippedError

        raise QuirkSkippedError(f"{message} (NRL_SHIM_STRICT=1; to go on without it set NRL_SHIM_DISABLE={quirk.id})")
    if quirk.id not in _State.skipped:
        _State.skipped.add(quirk.id)
        _report().record(quirk.id, "skipped", "%s", message, state=state)
