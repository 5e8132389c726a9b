"""`import nrl_shim` and `import ray` in the order argv[1] names (shim_first or target_first); print what is patched."""

import sys

from shim_layers import layers

# isort: off
if sys.argv[1] == "shim_first":
    import nrl_shim
    import ray
else:
    import ray
    import nrl_shim
# isort: on
import json  # noqa: E402

import ray._private.worker as w  # noqa: E402

print(json.dumps([nrl_shim.is_active(), layers(w.init), ray.init is w.init, nrl_shim.activation.patched()]))
