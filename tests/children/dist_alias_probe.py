"""What importlib.metadata says about `vllm` in this interpreter, as JSON: run with `python -S` and PYTHONPATH set to
the checkout and the test's site directories (so only those distributions exist), NRL_SHIM=1 or 0. argv[1] "pip":
import pip's internals first (pip's process); "deactivate": activate, then deactivate."""

import json
import os
import sys

mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "pip":
    import pip._internal.metadata  # noqa: F401
import importlib.metadata as md  # noqa: E402

import nrl_shim  # noqa: E402  (with NRL_SHIM=1 this activates: -S skips the .pth)

if mode == "deactivate":
    nrl_shim.deactivate()

out = {"active": nrl_shim.is_active(), "finders": [type(f).__name__ for f in sys.meta_path]}
try:
    dist = md.distribution("vllm")
    out["version"] = md.version("vllm")
    out["name"] = dist.metadata["Name"]
    out["files"] = sorted(str(f) for f in dist.files or [])
    out["entry_points"] = sorted(f"{e.group}:{e.name}" for e in dist.entry_points)
    out["requires"] = dist.requires
    out["location"] = os.path.dirname(str(dist.locate_file("vllm/__init__.py")))
except md.PackageNotFoundError as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
out["by_name"] = len(list(md.distributions(name="vllm")))
out["enumerated"] = sorted(d.metadata["Name"] for d in md.distributions())
out["packages"] = md.packages_distributions().get("vllm")
out["console_scripts"] = sorted(e.value for e in md.entry_points(group="console_scripts"))
print(json.dumps(out))
