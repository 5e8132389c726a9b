"""What a process sees of the plugin quirks (the shim activated by the environment: NRL_SHIM=1 and the .pth, or
`import nrl_shim` below). Prints one JSON line: quirk ids and their distributions, whether this start scanned the
installed distributions (importlib.metadata loaded), and, when `--target MODULE` is given, what MODULE.run() returns
once imported (a plugin quirk patches it)."""

import json
import sys

scanned_at_start = "importlib.metadata" in sys.modules
import nrl_shim  # noqa: E402,F401  (activates, unless NRL_SHIM=0)
from nrl_shim import registry  # noqa: E402

out = {
    "scanned": scanned_at_start or "importlib.metadata" in sys.modules,
    "quirks": {q.id: registry.origin(q.id) for q in registry.quirks() if not q.module_name.startswith("nrl_shim.")},
}
if "--target" in sys.argv:
    import importlib

    out["run"] = importlib.import_module(sys.argv[sys.argv.index("--target") + 1]).run()
    active = nrl_shim.active_settings()
    out["settings"] = active and {k: v for k, v in active.as_dict().items() if k.startswith("acme")}
print(json.dumps(out, default=str))
