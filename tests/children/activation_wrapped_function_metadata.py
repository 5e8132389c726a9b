"""The patched function keeps signature, name and doc, and pickles (pickle and cloudpickle) to itself."""

import inspect
import json
import pickle

import ray._private.worker as w

original = w.init
sig, doc = str(inspect.signature(original)), original.__doc__
# isort: off
import nrl_shim  # noqa: E402, F401  (activates; after the target on purpose)
import cloudpickle  # noqa: E402

# isort: on

print(
    json.dumps(
        [
            w.init is not original,
            str(inspect.signature(w.init)) == sig,
            w.init.__name__,
            w.init.__doc__ == doc,
            pickle.loads(pickle.dumps(w.init)) is w.init,
            cloudpickle.loads(cloudpickle.dumps(w.init)) is w.init,
        ]
    )
)
