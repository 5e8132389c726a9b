"""Another wrapt wrapper stacked over ours survives deactivate(); ours is switched off and back on beneath it."""

import json

import wrapt
from shim_layers import layers

# isort: off
import nrl_shim  # the shim first, then the target
import ray._private.worker as w

# isort: on

calls = []


def other(wrapped, instance, args, kwargs):
    calls.append(1)
    return wrapped(*args, **kwargs)


wrapt.wrap_function_wrapper(w, "init", other)
theirs = w.init
nrl_shim.deactivate()
still_theirs = w.init is theirs
ours_off = layers(w.init)
nrl_shim.activate()
print(json.dumps([still_theirs, ours_off, layers(w.init), w.init is theirs]))
