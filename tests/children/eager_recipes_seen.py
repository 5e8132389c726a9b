"""The recipe this process sees: NRL_SHIM_RECIPE, and the one in the shim's settings."""

import json
import os

import nrl_shim

print(json.dumps([os.environ.get("NRL_SHIM_RECIPE"), nrl_shim.active_settings().recipe]))
