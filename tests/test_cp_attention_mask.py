"""cp-attention-mask: inside a real context_parallel context (gloo, CPU, 1 and 2 ranks), SDPA with an attn_mask raises
the shim's error; outside CP, and with the quirk disabled, torch behaves as it does on its own."""

import pytest

from cp_helpers import TORCH_CPU_CP_ERRORS, is_torch_error, run

pytest.importorskip("torch", reason="needs torch, not installed here")

ID = "cp-attention-mask"

CHILD = "cp_attention_mask"  # tests/children/cp_attention_mask.py: one rank


@pytest.fixture(scope="module", params=[1, 2], ids=["ws1", "ws2"])
def ranks(request):
    # ws1 starts with the quirk disabled (fresh interpreter), then enables it; ws2 goes the other way round.
    order = [ID, ""] if request.param == 1 else ["", ID]
    return request.param, run(CHILD, request.param, order, start_disabled=order[0])


def test_mask_raises_shim_error_inside_cp(ranks):
    world_size, results = ranks
    for rank in results:
        on = rank["none"]
        for case, shape, dtype in [
            ("mask_2d", "(16, 16)", "torch.bool"),
            ("mask_4d_kw", "(1, 1, 16, 16)", "torch.bool"),
            ("mask_positional", f"({1}, 1, {16 // world_size}, {16 // world_size})", "torch.float32"),
        ]:
            out = on[case]
            assert out["shim"] and out["value_error"] and out["type"] == "UnsupportedConfigError", (case, out)
            msg = out["msg"]
            assert msg.startswith("context parallel: scaled_dot_product_attention was called with an attn_mask")
            assert f"shape {shape}, dtype {dtype}" in msg
            assert "only supports SDPA without an attention mask or bias" in msg
            assert "turn context parallel off" in msg and "Gemma-3" in msg and f"NRL_SHIM_DISABLE={ID}" in msg


def test_mask_without_quirk_is_torchs_own_error(ranks):
    world_size, results = ranks
    for rank in results:
        off = rank[ID]
        assert is_torch_error(off["mask_2d"], "Sharding dim 2 greater than tensor ndim 2"), off["mask_2d"]
        assert "mask_4d_kw" not in off  # see the child: too slow to let torch run


def test_no_mask_goes_through_unchanged(ranks):
    _ws, results = ranks
    for rank in results:
        on, off = rank["none"]["no_mask"], rank[ID]["no_mask"]
        # On CPU, torch has no CP handler for SDPA: the call reaches torch and fails there, identically with and
        # without the guard.
        assert is_torch_error(on, *TORCH_CPU_CP_ERRORS), on
        assert (on["type"], on["msg"]) == (off["type"], off["msg"])


def test_nothing_changes_outside_cp_and_everything_is_restored(ranks):
    _ws, results = ranks
    for rank in results:
        for phase in ("none", ID):
            assert rank[phase]["outside"] == {"ok": True, "value": True}
            assert rank[phase]["buffers_restored"] == {"ok": True, "value": True}
            assert rank[phase]["sdpa_restored"] is True
            assert rank[phase]["cp_wrapped"] == [True, True]  # the other cp-* quirks keep the shared wrapper
        assert rank["after_deactivate"] == {"sdpa_restored": True, "cp_wrapped": [False, True]}


@pytest.mark.parametrize("order", ["shim_first", "torch_first"])
def test_import_order_and_no_extra_imports(order):
    # torch's CP modules imported before or after activation: the real implementation gets the shared wrapper and the
    # public name points at it; patching the torch side imports nothing from transformers.
    from conftest import run_child_json

    out, _ = run_child_json("cp_import_order", order)
    assert out == [
        [True, True],
        ["cp-attention-mask", "cp-flash-attention", "cp-gemma3", "cp-sequence-parallel"],
        False,
    ]
