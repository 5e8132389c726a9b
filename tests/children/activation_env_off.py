"""Run with NRL_SHIM unset or 0: whether start-up loaded the shim, and whether `import nrl_shim` activates it."""

import json
import sys

loaded = "nrl_shim" in sys.modules
import nrl_shim  # noqa: E402

print(json.dumps([loaded, nrl_shim.is_active()]))
