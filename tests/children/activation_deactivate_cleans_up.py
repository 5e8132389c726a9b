"""deactivate() takes back the exported NRL_SHIM variable and the import watcher."""

import json
import os
import sys

import nrl_shim

exported = os.environ.get("NRL_SHIM")
watching = any(type(f).__name__ == "_TargetFinder" for f in sys.meta_path)
nrl_shim.deactivate()
print(
    json.dumps(
        [
            exported,
            watching,
            os.environ.get("NRL_SHIM"),
            any(type(f).__name__ == "_TargetFinder" for f in sys.meta_path),
            nrl_shim.is_active(),
        ]
    )
)
