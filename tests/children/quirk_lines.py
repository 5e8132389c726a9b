"""Activate the shim, import the given modules (a failed import is recorded, not raised), and print one JSON object:
the shim's log lines and the (quirk, module) pairs patched. `python quirk_lines.py MODULE...`"""

import json
import logging
import sys

import nrl_shim
from nrl_shim import activation

lines = []


class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())


logging.getLogger("nrl_shim").addHandler(Keep())
nrl_shim.activate()
errors = {}
for name in sys.argv[1:]:
    try:
        __import__(name)
    except Exception as error:
        errors[name] = f"{type(error).__name__}: {error}"
print(json.dumps({"lines": lines, "patched": activation.patched(), "errors": errors}))
