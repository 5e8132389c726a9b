"""Run with NRL_SHIM=1: nrl_shim.pth activated the shim at start-up, and wrapt waits for the first target import."""

import json
import sys

first = ["nrl_shim" in sys.modules, "wrapt" in sys.modules]
import nrl_shim  # noqa: E402

active = nrl_shim.is_active()
import ray  # noqa: E402, F401

print(json.dumps(first + [active, "wrapt" in sys.modules]))
