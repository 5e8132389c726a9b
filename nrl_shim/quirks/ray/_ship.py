"""How ray-propagate-env merges the shim into a job's runtime_env and ships the package (imported when Ray is).

Kept out of the quirk module itself: quirk modules load at every interpreter start-up, this code only where Ray is
imported. See quirks/ray/propagate_env.py for what is merged and why.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

ID = "ray-propagate-env"
_PREFIXES = ("NRL_SHIM", "NRL_VLLM_")
HOOK = "nrl_shim.ray_worker.setup"
PLUGINS_VAR = "NRL_SHIM_PLUGINS"  # plugins.ENV: the quirk modules workers load beside their own entry points
# Ray implements worker_process_setup_hook with this env var (Ray >= 2.9); without it there is nothing to hook into.
_RAY_HOOK_VAR = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
# Fields after which Ray accepts nothing but env_vars and config: the shim must be installed in that image instead.
_IMAGE_FIELDS = ("image_uri", "container")


class _Job:
    """What this driver shipped: the py_modules URIs Ray gave our package and the plugin packages at ray.init (for
    actor-level merges)."""

    shim_uris: list[str] = []
    staged_dir: str | None = None
    staged_plugins: dict[str, str] = {}  # plugin top-level package -> its staged copy


# Plugin packages above this size are not shipped (one warning): a quirk plugin is a few small modules; shipping a
# whole framework that happens to declare a quirk would shadow the worker's own copy of it.
_PLUGIN_MAX_BYTES = 16 * 1024 * 1024


def shim_env_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    from nrl_shim import registry

    source = os.environ if environ is None else environ
    declared = {v.name for v in registry.variables()}  # plugins' own settings too, whatever their prefix
    return {k: v for k, v in sorted(source.items()) if k.startswith(_PREFIXES) or k in declared}


def staged_package() -> str:
    """A copy of this package, as Ray's py_modules wants it: a directory named `nrl_shim`, no bytecode (so its
    content hash, and with it the upload, is the same for every driver of the same version). Made once per process."""
    if _Job.staged_dir is None or not os.path.isdir(_Job.staged_dir):
        import atexit
        import importlib
        import shutil
        import tempfile

        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_vendor")
        root = tempfile.mkdtemp(prefix="nrl-shim-ray-")
        atexit.register(shutil.rmtree, root, True)
        import nrl_shim

        package = os.path.dirname(os.path.abspath(nrl_shim.__file__))  # the package, wherever this module sits in it
        target = os.path.join(root, "nrl_shim")
        shutil.copytree(package, target, ignore=ignore)
        for dependency in ("wrapt", "packaging"):
            source = os.path.dirname(str(importlib.import_module(dependency).__file__))
            shutil.copytree(source, os.path.join(target, "_vendor", dependency), ignore=ignore)
        _Job.staged_dir = target
    return _Job.staged_dir


def plugins_to_ship(strict: bool) -> tuple[list[str], list[str]]:
    """(staged package directories for py_modules, quirk module names for NRL_SHIM_PLUGINS) of the plugin quirks of
    this process: a plugin installed only in the driver's environment reaches workers with their own Python the way
    the shim does. A plugin is shipped as its top-level package (keep quirk plugins in a package of their own)."""
    from nrl_shim import registry

    dirs: list[str] = []
    modules: list[str] = []
    for quirk in registry.quirks():
        source = registry.origin(quirk.id)
        if source == registry.BUILTIN:
            continue
        modules.append(quirk.module_name)
        top = quirk.module_name.partition(".")[0]
        package = sys.modules.get(top)
        paths = list(getattr(package, "__path__", None) or [])
        if top == "nrl_shim" or top in _Job.staged_plugins:
            staged = _Job.staged_plugins.get(top)
            if staged and staged not in dirs:
                dirs.append(staged)
            continue
        where = f"plugin {quirk.module_name!r} ({source})"
        if len(paths) != 1 or not os.path.isdir(paths[0]):
            _cannot_ship(where, "not a regular package directory (Ray's py_modules takes directories)", strict)
            continue
        size = sum(
            os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(paths[0]) for f in files if f[-4:] != ".pyc"
        )
        if size > _PLUGIN_MAX_BYTES:
            _cannot_ship(
                where, f"its package {top!r} is {size // 2**20} MiB; install it in the workers instead", strict
            )
            continue
        staged = _stage(paths[0], top)
        _Job.staged_plugins[top] = staged
        dirs.append(staged)
    return dirs, modules


def _stage(source: str, name: str) -> str:
    import atexit
    import shutil
    import tempfile

    root = tempfile.mkdtemp(prefix="nrl-shim-ray-plugin-")
    atexit.register(shutil.rmtree, root, True)
    target = os.path.join(root, name)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def _cannot_ship(where: str, why: str, strict: bool) -> None:
    from nrl_shim import report
    from nrl_shim.errors import UnsupportedConfigError

    message = f"[{ID}] {where} is not shipped to Ray workers: {why}"
    if strict:
        raise UnsupportedConfigError(f"{message} (NRL_SHIM_STRICT=1)")
    report.warn_once(ID, where, message)


def _injected_job_runtime_env() -> dict[str, Any]:
    # A driver started by Ray Jobs (`ray job submit`) gets the submission's runtime_env in this variable; Ray refuses
    # to merge it with ray.init's when both set the same field or env var, so those are left alone.
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return {}
    try:
        import json

        return dict(json.loads(raw).get("runtime_env") or {})
    except (ValueError, AttributeError):
        return {}


def _ship_problem(runtime_env: dict[str, Any], injected: dict[str, Any]) -> tuple[str, str] | None:
    """(field, why) when the shim can't be merged into this runtime_env; None when it can."""
    for field in _IMAGE_FIELDS:
        if runtime_env.get(field) or injected.get(field):
            return field, (
                "Ray accepts only env_vars and config beside it, so the shim can't be shipped; install "
                "nrl-shim in that image and set NRL_SHIM=1 there"
            )
    for field in ("py_modules", "worker_process_setup_hook"):
        if injected.get(field):
            return field, "set by the Ray Jobs submission, and Ray refuses to merge ray.init's with it"
    py_modules = runtime_env.get("py_modules")
    if py_modules is not None and not isinstance(py_modules, (list, tuple)):
        return "py_modules", f"expected a list, got {type(py_modules).__name__}"
    hook = runtime_env.get("worker_process_setup_hook")
    if hook is not None and not isinstance(hook, str) and not callable(hook):
        return "worker_process_setup_hook", f"expected an import path or a callable, got {type(hook).__name__}"
    if _RAY_HOOK_VAR in (runtime_env.get("env_vars") or {}):
        return "env_vars", f"{_RAY_HOOK_VAR} is set by hand"
    return None


def _cannot_merge(field: str, why: str, strict: bool) -> None:
    from nrl_shim import report
    from nrl_shim.errors import UnsupportedConfigError

    message = (
        f"[{ID}] runtime_env[{field!r}]: {why}. Workers with their own Python get no shim; workers that have "
        f"nrl-shim installed still activate through NRL_SHIM=1"
    )
    if strict:
        raise UnsupportedConfigError(f"{message} (NRL_SHIM_STRICT=1; to go on without it set NRL_SHIM_RAY_SHIP=0)")
    report.warn_once(ID, field, message)


def merge_job_runtime_env(runtime_env: Any, ship: bool, strict: bool = False) -> Any:
    """The job-level runtime_env with the shim merged in (a new object; the user's is not modified)."""
    from nrl_shim import report
    from nrl_shim.ray_worker import CHAINED_HOOK_VAR, chain

    before = dict(runtime_env) if runtime_env else {}
    injected = _injected_job_runtime_env()
    after = dict(before)
    user_vars = dict(before.get("env_vars") or {})
    taken = set(user_vars) | set(injected.get("env_vars") or {})
    added = {k: v for k, v in shim_env_vars().items() if k not in taken}
    if ship:
        problem = _ship_problem(before, injected)
        if problem:
            _cannot_merge(*problem, strict=strict)
        else:
            plugin_dirs, plugin_modules = plugins_to_ship(strict)
            py_modules = [*(before.get("py_modules") or ()), staged_package(), *plugin_dirs]
            after["py_modules"] = py_modules
            if plugin_modules and PLUGINS_VAR not in taken:
                listed = [m for m in os.environ.get(PLUGINS_VAR, "").split(",") if m.strip()]
                added[PLUGINS_VAR] = ",".join(dict.fromkeys([*listed, *plugin_modules]))
            hook = before.get("worker_process_setup_hook")
            if hook is None:
                after["worker_process_setup_hook"] = HOOK
            elif isinstance(hook, str):
                after["worker_process_setup_hook"] = HOOK
                added[CHAINED_HOOK_VAR] = hook
            else:
                after["worker_process_setup_hook"] = chain(hook)
            report.changed(
                ID,
                "ray.init runtime_env['py_modules']",
                [str(m) for m in before.get("py_modules") or ()],
                [str(m) for m in py_modules],
                "so workers with their own Python can import the shim (and its plugin quirks)",
            )
            report.changed(
                ID,
                "ray.init runtime_env['worker_process_setup_hook']",
                _hook_name(hook),
                HOOK if hook is None else f"{HOOK}, then {_hook_name(hook)}",
                "activates the shim in every worker of the job before its code runs",
            )
    if added:
        after["env_vars"] = {**user_vars, **added}
        report.changed(
            ID,
            "ray.init runtime_env['env_vars']",
            user_vars,
            after["env_vars"],
            "so workers on a separately started Ray cluster activate the shim too",
        )
    if after == before:
        return runtime_env
    if runtime_env is not None and type(runtime_env) is not dict:
        return type(runtime_env)(**after)  # ray.runtime_env.RuntimeEnv is a dict subclass built from kwargs
    return after


def _hook_name(hook: Any) -> str | None:
    if hook is None or isinstance(hook, str):
        return hook
    return f"{getattr(hook, '__module__', '?')}.{getattr(hook, '__qualname__', repr(hook))}"


def _uploaded_uris(count: int) -> list[str]:
    """The URIs Ray gave our package and the plugins when ray.init uploaded them (the last `count` py_modules entries
    of the job's runtime_env)."""
    try:
        import ray

        modules = ray.get_runtime_context().runtime_env.get("py_modules") or []
    except Exception:  # a Ray without runtime_context.runtime_env: actor-level merges just won't happen
        return []
    shipped = [str(m) for m in modules[-count:]] if len(modules) >= count else []
    return shipped if all("://" in m for m in shipped) else []


def init_wrapper(wrapped, instance, args, kwargs, current):
    ship = current.ray_ship and _ray_has_setup_hook()
    runtime_env = kwargs.get("runtime_env")
    merged = merge_job_runtime_env(runtime_env, ship=ship, strict=current.strict)
    if merged is not runtime_env:
        kwargs = dict(kwargs, runtime_env=merged)
    # Before the call: Ray replaces local py_modules by their URIs in place while uploading.
    listed = list(merged.get("py_modules") or ()) if isinstance(merged, dict) else []
    shipped = _Job.staged_dir is not None and _Job.staged_dir in listed
    count = len(listed) - listed.index(_Job.staged_dir) if shipped else 0  # ours and the plugins', last in the list
    result = wrapped(*args, **kwargs)
    _Job.shim_uris = _uploaded_uris(count) if shipped else []
    from nrl_shim.job_report import note_ray_driver

    address = kwargs.get("address", args[0] if args else None)
    note_ray_driver(started_here=address is None and not os.environ.get("RAY_ADDRESS"))  # the report reads its nodes
    return result


def _ray_has_setup_hook() -> bool:
    constants = sys.modules.get("ray._private.ray_constants")
    if getattr(constants, "WORKER_PROCESS_SETUP_HOOK_ENV_VAR", None) == _RAY_HOOK_VAR:
        return True
    from nrl_shim import report

    report.warn_once(
        ID,
        "no-hook",
        f"[{ID}] this Ray has no worker_process_setup_hook (Ray >= 2.9): the shim is not "
        "shipped; workers activate only where nrl-shim is installed",
    )
    return False


def task_runtime_env_wrapper(wrapped, instance, args, kwargs):
    """An actor's or task's own py_modules replace the job's: append our uploaded package to them. Wrapped at
    submission (get_runtime_env_info), so envs given to @ray.remote before ray.init are covered too."""
    runtime_env = args[0] if args else kwargs.get("runtime_env")
    uris = _Job.shim_uris
    if uris and runtime_env and not kwargs.get("is_job_runtime_env"):
        modules = runtime_env.get("py_modules")
        missing = [uri for uri in uris if isinstance(modules, (list, tuple)) and uri not in modules]
        if isinstance(modules, (list, tuple)) and modules and missing:
            from nrl_shim import report

            # Ray's own RuntimeEnv, parsed from the user's options (not the user's dict): updated in place, once.
            runtime_env["py_modules"] = [*modules, *missing]
            report.changed(
                ID,
                "actor/task runtime_env['py_modules']",
                list(modules),
                [*modules, *missing],
                "an actor's own py_modules replace the job's; the shim's package must stay",
            )
    return wrapped(*args, **kwargs)
