"""`import nrl_shim` and torch's CP modules in the order argv[1] names (shim_first or torch_first): is context_parallel
wrapped, which cp-* quirks patched, and was transformers imported."""

import sys

# isort: off
if sys.argv[1] == "shim_first":
    import nrl_shim
    import torch.distributed.tensor.experimental  # noqa: F401
else:
    import torch.distributed.tensor.experimental  # noqa: F401
    import nrl_shim
# isort: on
import json  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for cp_helpers
from cp_helpers import cp_wrapped  # noqa: E402

patched = sorted({quirk for quirk, _module in nrl_shim.activation.patched() if quirk.startswith("cp-")})
print(json.dumps([cp_wrapped(), patched, "transformers" in sys.modules]))
