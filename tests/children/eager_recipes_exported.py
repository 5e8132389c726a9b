"""The shim detects the recipe from this program's command line (`--config X.yaml`, in argv) and exports it as
NRL_SHIM_RECIPE: what a subprocess sees, and what deactivate() leaves."""

import json
import os
import subprocess
import sys
from pathlib import Path

import nrl_shim

child = subprocess.run(
    [sys.executable, str(Path(__file__).with_name("eager_recipes_seen.py"))], capture_output=True, text=True, check=True
)
exported = os.environ.get("NRL_SHIM_RECIPE")
nrl_shim.deactivate()
print(
    json.dumps(
        {
            "exported": exported,
            "child": json.loads(child.stdout),
            "after_deactivate": os.environ.get("NRL_SHIM_RECIPE"),
        }
    )
)
