"""Runs first in every Ray worker process of a job whose driver had the shim active: Ray's worker_process_setup_hook.

The driver ships this package to the job with runtime_env["py_modules"] (see quirks/ray/propagate_env.py), so it is
importable in workers whose runtime_env sets their own interpreter (py_executable, uv, pip, conda) without nrl-shim.
Ray puts the shipped copy on the worker's PYTHONPATH, ahead of site-packages: when a worker also has its own nrl-shim
installed, the driver's shipped copy is the one that runs (every process of a job then applies the same fixes), and
that is logged once. Stdlib only until activation: this runs at every worker start.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

# The user's own job-level worker_process_setup_hook (an import path), run right after ours.
CHAINED_HOOK_VAR = "NRL_SHIM_RAY_CHAINED_HOOK"
# Holds a sitecustomize.py that activates the shim: on PYTHONPATH, it reaches the worker's own children (vLLM engine
# core processes, multiprocessing and subprocess Pythons), which run no Ray hook and may have no nrl_shim.pth.
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")


def setup() -> None:
    """The hook: activate the shim in this worker, make its children activate too, then run the user's own hook."""
    import nrl_shim

    nrl_shim.activate(how="the Ray worker setup hook (ray-propagate-env)")
    _export_to_children()
    _note_installed_copy(nrl_shim.__version__)
    chained = os.environ.get(CHAINED_HOOK_VAR)
    if chained:
        _load(chained)()


def chain(user_hook: Callable[[], object]) -> Callable[[], None]:
    """A hook that runs ours, then the user's callable hook (Ray pickles it by value and exports it to the job)."""

    def nrl_shim_setup_then_user_hook() -> None:
        setup()
        user_hook()

    return nrl_shim_setup_then_user_hook


def _export_to_children() -> None:
    # Children inherit os.environ: NRL_SHIM=1 (activate() exported it) plus a PYTHONPATH that finds both the shipped
    # package and the bootstrap sitecustomize.
    import nrl_shim

    package_root = os.path.dirname(os.path.dirname(os.path.abspath(nrl_shim.__file__)))  # the folder holding nrl_shim/
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    missing = [d for d in (BOOTSTRAP_DIR, package_root) if d not in entries]
    if missing:
        os.environ["PYTHONPATH"] = os.pathsep.join([*missing, *entries])


def _note_installed_copy(running: str) -> None:
    """One INFO line when this worker has its own nrl-shim installed but the driver's shipped copy is the one running."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("nrl-shim")
    except PackageNotFoundError:
        return
    here = os.path.dirname(os.path.realpath(__file__))
    if any(os.path.realpath(os.path.join(d, "nrl_shim")) == here for d in _site_dirs()):
        return  # the installed copy is the one running: nothing to say
    from . import report

    report.logger().info(
        "Ray worker (pid %d): nrl-shim %s is installed in this worker's environment; running the driver's shipped "
        "copy %s from %s instead (rule: the driver's copy wins, so every process of the job applies the same fixes)",
        os.getpid(),
        installed,
        running,
        here,
    )


def _site_dirs() -> list[str]:
    import site

    return [*site.getsitepackages(), site.getusersitepackages()]


def _load(path: str) -> Callable[[], object]:
    # "package.module.function" (Ray's own format for worker_process_setup_hook strings).
    import importlib

    module_name, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise ImportError(
            f"{CHAINED_HOOK_VAR}={path!r}: cannot load the job's own worker_process_setup_hook: {err}"
        ) from err


if __name__ == "__main__":  # pragma: no cover - a helper for images: print the directory to put on PYTHONPATH
    sys.stdout.write(BOOTSTRAP_DIR + "\n")
