"""With argv[1] (a folder holding an entry-point plugin distribution) on sys.path: the eager reason of each of a few
recipe names and of argv[2] (a flagged recipe), as JSON."""

import json
import sys

sys.path.insert(0, sys.argv[1])
from nrl_shim.quirks.vllm.config import eager_recipes as q  # noqa: E402
from nrl_shim.registry import load_settings  # noqa: E402

s = load_settings({})
print(json.dumps({r: q.eager_reason(r, s) for r in ["team-a-x", "team-b-2", "team-c-y", "team-d", sys.argv[2]]}))
