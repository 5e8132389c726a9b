"""importlib.reload of a target while the shim is deactivated leaves the original function."""

import importlib
import json

from shim_layers import layers

# isort: off
import nrl_shim  # the shim first, then the target
import ray._private.worker as w

# isort: on

nrl_shim.deactivate()
importlib.reload(w)
print(json.dumps([layers(w.init), type(w.init).__name__]))
