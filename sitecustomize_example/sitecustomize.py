"""Activate nrl-shim in every interpreter of an image where a .pth file can't be used (e.g. site-packages is
read-only or pruned), by putting this directory on PYTHONPATH. Chains to the sitecustomize it shadows."""

import importlib.util
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
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
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
