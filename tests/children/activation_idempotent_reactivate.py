"""activate() five times, deactivate() twice, activate() again: one layer each time, the original back in between."""

import json

import ray
import ray._private.worker as w
from shim_layers import layers

original = w.init
import nrl_shim  # noqa: E402  (after the target on purpose)

for _ in range(5):
    nrl_shim.activate()
once = layers(w.init)
nrl_shim.deactivate()
restored = w.init is original and ray.init is original
nrl_shim.deactivate()  # twice is fine
nrl_shim.activate()
again = layers(w.init)
print(json.dumps([once, restored, again, ray.init is w.init]))
