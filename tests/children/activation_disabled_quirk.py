"""Run with NRL_SHIM_DISABLE=ray-propagate-env: the quirk's function carries no layer, nothing is patched."""

import json

from shim_layers import layers

# isort: off
import nrl_shim  # the shim first, then the target
import ray._private.worker as w

# isort: on

print(json.dumps([layers(w.init), nrl_shim.activation.patched()]))
