"""Which quirk modules activation imported, and which importing the target module argv[1] added (as JSON)."""

import importlib
import json
import sys

import nrl_shim


def quirk_modules():
    return sorted(name for name in sys.modules if name.startswith("nrl_shim.quirks."))


at_activation = quirk_modules()
importlib.import_module(sys.argv[1])
print(json.dumps([nrl_shim.is_active(), at_activation, quirk_modules()]))
