"""Another wrapt wrapper applied before the shim is kept under ours, and is what deactivate() leaves."""

import json

import ray._private.worker as w
import wrapt
from shim_layers import layers


def other(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


wrapt.wrap_function_wrapper(w, "init", other)
theirs = w.init
import nrl_shim  # noqa: E402  (after the other wrapper on purpose)

on = layers(w.init)
nrl_shim.deactivate()
print(json.dumps([on, w.init is theirs]))
