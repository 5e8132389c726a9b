"""The CP quirks' shared context_parallel wrapper (nrl_shim/quirks/torch_cp/_common.py): a context left by an exception whose
sharded buffers the shim cannot restore. The user's exception must reach the user and the `nrl_shim` logger must say
that the buffers stay sharded (it used to raise ImportError from the cleanup instead)."""

import contextlib
import logging
import sys
import types

import pytest

UNRESTORED = (
    "context_parallel was left by an exception and torch did not restore the sharded buffers; nrl-shim could not "
    "find torch's copies to restore them either"
)


def _install_fake_torch(monkeypatch):
    """Just what the cleanup reads: torch, torch.nn.functional's SDPA, DTensor's dispatcher handlers."""
    root = types.ModuleType("torch")
    nn = types.ModuleType("torch.nn")
    functional = types.ModuleType("torch.nn.functional")
    functional.scaled_dot_product_attention = lambda *args, **kwargs: None
    distributed = types.ModuleType("torch.distributed")
    tensor = types.ModuleType("torch.distributed.tensor")
    tensor.DTensor = type("DTensor", (), {"_op_dispatcher": types.SimpleNamespace(_custom_op_handlers={})})
    root.nn, nn.functional, root.distributed, distributed.tensor = nn, functional, distributed, tensor
    for module in (root, nn, functional, distributed, tensor):
        monkeypatch.setitem(sys.modules, module.__name__, module)


@pytest.fixture
def shim_warnings(caplog):
    from nrl_shim import report

    log = report.logger()  # its own handler, propagate=False: caplog's handler has to sit on it directly
    log.addHandler(caplog.handler)
    yield lambda: [r.getMessage() for r in caplog.records if r.name == "nrl_shim" and r.levelno == logging.WARNING]
    log.removeHandler(caplog.handler)


def test_exception_exit_with_unreachable_buffers_warns_and_reraises(monkeypatch, shim_warnings):
    # Plain objects stand in for torch: the CP module of torch <= 2.9 (which never cleans up after an exception), and a
    # context manager that is not torch's generator, so the shim finds no copies of the buffers to put back.
    from nrl_shim.quirks.torch_cp import _common as _torch_cp

    _install_fake_torch(monkeypatch)
    cp_module = types.ModuleType(_torch_cp.LEGACY)

    @contextlib.contextmanager
    def context_parallel(mesh, buffers=()):
        yield

    cp_module.context_parallel = context_parallel
    with pytest.raises(RuntimeError, match="user code failed inside CP"):
        with _torch_cp._scope(cp_module, contextlib.nullcontext()):
            assert _torch_cp.active()
            raise RuntimeError("user code failed inside CP")
    assert not _torch_cp.active()
    assert shim_warnings() == [UNRESTORED]


def test_real_cp_left_by_exception_with_unreachable_buffers():
    # Two gloo ranks on CPU; another tool's context manager sits between the shim and torch's context_parallel.
    pytest.importorskip("torch", reason="needs torch, not installed here")
    from cp_helpers import run_ranks

    for rank in run_ranks("cp_unrestorable_buffers", 2):
        assert rank["patched"] == ["cp-attention-mask", "cp-flash-attention", "cp-gemma3", "cp-sequence-parallel"]
        assert rank["sharded"] == [1, 8]
        assert rank["raised"] == "RuntimeError: user code failed inside CP"  # the user's own exception
        assert rank["sdpa_restored"] is True
        left_sharded = rank["buffer_after"] == [1, 8]
        # Warned exactly when the buffers stay sharded (torch >= 2.10 builds that clean up themselves: no warning).
        assert rank["warnings"] == ([UNRESTORED] if left_sharded else []), rank
        if rank["real_module"] == "torch.distributed.tensor.experimental._attention":
            # torch <= 2.9 restores nothing after an exception: this is the path that used to raise ImportError.
            assert left_sharded, rank
