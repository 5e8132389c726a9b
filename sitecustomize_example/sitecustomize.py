# nrl-shim's start-up hook for an image without nrl_shim.pth: copy this file into a directory of its own at the
# front of sys.path (see README.md here). Written by `python -m nrl_shim.docs` from
# nrl_shim/_bootstrap/sitecustomize.py (edit that one; tests fail while this copy differs).
"""Start-up hook for interpreters that can't use the installed nrl_shim.pth: a Ray worker's own venv, an image whose
site-packages is read-only or pruned. Put this directory on PYTHONPATH (the Ray worker hook does it for the worker's
children) and every Python process started with NRL_SHIM=1 activates the shim. Chains to the sitecustomize it
shadows, so an image's own sitecustomize still runs. Stdlib only: it runs at every interpreter start-up."""

import os
import sys


def _chain_to_shadowed_sitecustomize():
    # Python imports only the first sitecustomize on sys.path; find the next one after ours and run it too.
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            import importlib.util

            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            if spec is None or spec.loader is None:
                return  # not loadable as a source file: nothing we could run
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


_chain_to_shadowed_sitecustomize()

if os.environ.get("NRL_SHIM", "").strip().lower() not in ("", "0", "false", "no", "off"):
    try:
        import nrl_shim  # noqa: F401  (activates; a bad setting ends the process with one clear line)
    except ModuleNotFoundError as err:
        if err.name != "nrl_shim":
            raise
