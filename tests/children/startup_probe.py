"""What an interpreter's start-up did with NRL_SHIM=1 (run with nrl_shim/_bootstrap on PYTHONPATH, or the installed
.pth): which nrl_shim modules it loaded and what it put on sys.meta_path; then, for each `--target MODULE` (imported
by one thread each, all at once), what MODULE.run() returns, and the state after. `--deactivate`: deactivate first.
Prints one JSON line."""

import json
import sys
import threading


def loaded():
    return sorted(name for name in sys.modules if name == "nrl_shim" or name.startswith("nrl_shim."))


def finders():
    return [type(f).__name__ for f in sys.meta_path if type(f).__module__.startswith("nrl_shim")]


out = {"at_start": loaded(), "finders_at_start": finders()}
import nrl_shim  # noqa: E402  (already imported by start-up when NRL_SHIM=1)

out["active"] = nrl_shim.is_active()
if "--deactivate" in sys.argv:
    nrl_shim.deactivate()
    out["active_after_deactivate"] = nrl_shim.is_active()
targets = [sys.argv[i + 1] for i, arg in enumerate(sys.argv) if arg == "--target"]
barrier = threading.Barrier(max(len(targets), 1))
results = {}


def run(name):
    barrier.wait()
    module = __import__(name, fromlist=["_"])
    results[name] = module.run() if hasattr(module, "run") else None


threads = [threading.Thread(target=run, args=(name,)) for name in targets]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
from nrl_shim import activation  # noqa: E402

out.update(results=results, after=loaded(), finders=finders(), patched=activation.patched())
print(json.dumps(out))
