"""`import nrl_shim`: which heavy modules are loaded afterwards (none should be)."""

import json
import sys

import nrl_shim  # noqa: F401

print(json.dumps(sorted(m for m in ("torch", "vllm", "transformers", "numpy", "ray", "wrapt") if m in sys.modules)))
