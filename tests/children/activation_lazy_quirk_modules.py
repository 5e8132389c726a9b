"""Which nrl_shim modules activation imported, and which importing the target module argv[1] added (as JSON). Any
further arguments stay in sys.argv, as a command line the shim may read (e.g. `--config recipe.yaml`)."""

import importlib
import json
import sys

import nrl_shim


def loaded():
    return sorted(name for name in sys.modules if name == "nrl_shim" or name.startswith("nrl_shim."))


at_activation = loaded()
importlib.import_module(sys.argv[1])
print(json.dumps([nrl_shim.is_active(), at_activation, loaded()]))
