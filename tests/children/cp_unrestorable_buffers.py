"""One rank (started by cp_helpers.run_ranks): another tool wrapped torch's context_parallel in a context manager of its
own (as a profiler timing CP regions would) before the shim was activated, so the shim cannot reach torch's generator
and its copies of the buffers. A real context_parallel context is then left by an exception: what propagates, what the
`nrl_shim` logger says, and what state torch is left in."""

# isort: off
import contextlib
import sys
import torch
import torch.distributed.tensor.experimental  # noqa: F401  (loads the CP modules before the shim is activated)
import wrapt
from cp_helpers import context_parallel, finish, init, sdpa_is_torchs
from log_records import Records

# isort: on

# The module that holds context_parallel's code: _context_parallel/_attention.py on torch >= 2.10, else _attention.py.
REAL = next(
    module
    for module in (
        sys.modules.get("torch.distributed.tensor.experimental._context_parallel._attention"),
        sys.modules.get("torch.distributed.tensor.experimental._attention"),
    )
    if module is not None and getattr(module, "context_parallel", None) is not None
)


@contextlib.contextmanager
def _timed(cm):
    with cm as value:
        yield value


def other_tool(wrapped, instance, args, kwargs):
    return _timed(wrapped(*args, **kwargs))


wrapt.wrap_function_wrapper(REAL, "context_parallel", other_tool)

import nrl_shim  # noqa: E402
from nrl_shim import report  # noqa: E402

records = Records()
report.logger().addHandler(records)
rank, ws, mesh = init()
S = 16
ids = torch.arange(S).view(1, S)
try:
    with context_parallel(mesh, ids):
        sharded = list(ids.shape)
        raise RuntimeError("user code failed inside CP")
except Exception as exc:  # what reaches the user: their own exception, or one the shim raised while cleaning up
    raised = f"{type(exc).__name__}: {exc}"
finish(
    {
        "torch": torch.__version__,
        "real_module": REAL.__name__,
        "patched": sorted({quirk for quirk, _module in nrl_shim.activation.patched() if quirk.startswith("cp-")}),
        "sharded": sharded,
        "raised": raised,
        "buffer_after": list(ids.shape),
        "sdpa_restored": sdpa_is_torchs(),
        "warnings": [message for level, message in records.messages if level == "WARNING"],
    }
)
