"""importlib.reload of a patched target patches it again, once; re-activating stacks no second layer."""

import importlib
import json

from shim_layers import layers

# isort: off
import nrl_shim  # the shim first, then the target
import ray._private.worker as w

# isort: on

before = layers(w.init)
importlib.reload(w)
after_reload = layers(w.init)  # reload re-executes the module through our import hook: patched again, once
nrl_shim.activate()  # and re-activating does not stack a second layer
print(json.dumps([before, after_reload, layers(w.init), w.init.__module__]))
