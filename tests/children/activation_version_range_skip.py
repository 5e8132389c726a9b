"""ray-propagate-env declared for a Ray range the installed Ray is outside of: skipped (a warning, or with
NRL_SHIM_STRICT=1 an error), the function left as it is."""

import importlib

from nrl_shim import registry

registry.get("ray-propagate-env").versions = "<1"  # declare a range the installed Ray is outside of
# isort: off
import nrl_shim  # noqa: E402, F401
import ray  # noqa: E402, F401
import ray._private.worker as w  # noqa: E402

# isort: on

importlib.import_module("ray._private.worker")
print("imported", type(w.init).__name__)
