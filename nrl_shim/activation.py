"""Activation: settings -> registry -> patches applied when each target module is imported.

Start-up path (NRL_SHIM=1, no target imported) is stdlib only: a tiny meta-path finder watches for the first target
import and only then loads wrapt and hands over to wrapt's post-import hooks (importing wrapt costs ~59 ms).
"""

import os
import sys
import _thread  # not `threading`: it drags functools/collections into every interpreter start-up

from . import registry
from .errors import QuirkSkippedError, ShimError
from .settings import _FALSE, Settings


class _State:
    active = False
    settings = None
    exported_nrl_shim = False  # we set NRL_SHIM=1 ourselves (so children activate) and must remove it on deactivate
    machinery = False  # wrapt loaded and hooks registered
    registered = set()  # target module names with a wrapt post-import hook pending or fired
    patched = set()  # (quirk id, target module name) currently patched
    gates = {}  # quirk id -> (applies, version, reason), computed on first target import
    skipped = set()  # quirk ids already warned about


_lock = _thread.RLock()


def settings():
    """The active Settings, or None when the shim is not active."""
    return _State.settings if _State.active else None


def is_active():
    return _State.active


def patched():
    """(quirk id, module name) pairs patched in this process, for doctor and tests."""
    return sorted(_State.patched)


def activate(settings=None):
    """Activate the shim in this process (idempotent) and return the effective Settings.

    Calling it again re-applies fixes that were lost (e.g. after importlib.reload of a target module).
    """
    with _lock:
        if not _State.active:
            settings = settings or Settings.from_env(known_ids=registry.quirk_ids())
            if os.environ.get("NRL_SHIM") != "1":
                os.environ["NRL_SHIM"] = "1"  # children (spawn, subprocess, Ray workers) inherit it and activate too
                _State.exported_nrl_shim = True
            _State.settings, _State.active = settings, True
            for quirk in _enabled_quirks():
                if quirk.setup:
                    quirk.setup(settings)
            if not _State.machinery and not any(name in sys.modules for name in _target_names()):
                if not any(isinstance(f, _TargetFinder) for f in sys.meta_path):
                    sys.meta_path.insert(0, _TargetFinder())
                return settings
        _load_machinery()
        for quirk in _enabled_quirks():
            for name in quirk.targets:
                if name in sys.modules:
                    _apply(quirk, sys.modules[name])
        return _State.settings


def deactivate():
    """Undo everything activate() did in this process: patches, exported variables, the import watcher."""
    with _lock:
        if not _State.active:
            return
        for quirk_id, name in sorted(_State.patched):
            module = sys.modules.get(name)
            if module is not None:
                registry.get(quirk_id).unpatch(module)
        for quirk in _enabled_quirks():
            teardown = getattr(quirk.module, "teardown", None)
            if teardown:
                teardown()
        _State.patched.clear()
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TargetFinder)]
        if _State.exported_nrl_shim:
            os.environ.pop("NRL_SHIM", None)
            _State.exported_nrl_shim = False
        _State.active, _State.settings = False, None


def activate_on_import():
    """`import nrl_shim` activates, unless NRL_SHIM is explicitly off. Bad settings at interpreter start-up
    (the .pth or sitecustomize) end the process with one clear line instead of a traceback inside site.py."""
    if os.environ.get("NRL_SHIM", "").strip().lower() in _FALSE:
        return
    if os.path.basename(sys.argv[0] if sys.argv else "") == "nrl-shim":
        return  # the CLI validates and reports settings itself (doctor, run) and patches nothing in its own process
    try:
        activate()
    except ShimError as err:
        if not _imported_by_site():
            raise
        sys.stderr.write(f"nrl-shim: error: {err}\n")
        sys.stderr.flush()
        os._exit(2)  # SystemExit would be swallowed or turned into a fatal init error by site.py


def _imported_by_site():
    frame = sys._getframe()
    while frame is not None:
        if frame.f_globals.get("__name__") in ("site", "sitecustomize"):
            return True
        frame = frame.f_back
    return False


def _enabled_quirks():
    return [q for q in registry.quirks() if _State.settings.is_enabled(q.id)]


def _target_names():
    return {name for quirk in _enabled_quirks() for name in quirk.targets}


class _TargetFinder:
    """Watches imports until the first target module; never finds anything itself."""

    def find_spec(self, fullname, path=None, target=None):
        if _State.machinery or not _State.active or fullname not in _target_names():
            return None
        _load_machinery()
        # wrapt's finder was inserted into sys.meta_path after this import started, so hand it this import directly.
        for finder in sys.meta_path:
            if type(finder).__module__ == "wrapt.importer":
                return finder.find_spec(fullname, path, target)
        return None

    def invalidate_caches(self):
        pass


def _load_machinery():
    import wrapt

    with _lock:
        _State.machinery = True
        for name in sorted(_target_names() - _State.registered):
            if name not in sys.modules:
                _State.registered.add(name)
                wrapt.register_post_import_hook(_on_import, name)


def _on_import(module):
    _State.registered.discard(module.__name__)  # wrapt fires a hook once; a later activate() may need it again
    with _lock:
        if not _State.active:
            return
        for quirk in _enabled_quirks():
            if module.__name__ in quirk.targets:
                _apply(quirk, module)


def _apply(quirk, module):
    if quirk.id not in _State.gates:
        _State.gates[quirk.id] = quirk.gate()
    applies, _version, reason = _State.gates[quirk.id]
    if not applies:
        return _skip(quirk, reason)
    try:
        quirk.patch(module)
    except ShimError:
        raise
    except Exception as exc:  # never break the user's import over a fix we could not apply
        return _skip(quirk, f"could not patch {module.__name__}: {type(exc).__name__}: {exc}")
    _State.patched.add((quirk.id, module.__name__))


def _skip(quirk, reason):
    message = f"[{quirk.id}] fix skipped: {reason}"
    if _State.settings.strict:
        raise QuirkSkippedError(f"{message} (NRL_SHIM_STRICT=1; to go on without it set NRL_SHIM_DISABLE={quirk.id})")
    if quirk.id not in _State.skipped:
        _State.skipped.add(quirk.id)
        from . import report

        report.logger().warning("%s", message)
