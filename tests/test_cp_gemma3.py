"""cp-gemma3: a tiny Gemma-3 (built from a small config, no download) run inside a real context_parallel context (gloo,
CPU, 1 and 2 ranks) gets the shim's error before any attention runs; a tiny Llama with SDPA gets no shim error (torch
then fails on CPU with its own error); with the quirk disabled, what happens is what torch/transformers do."""

import pytest

from cp_helpers import TORCH_CPU_CP_ERRORS, TORCH_MASK_ERRORS, is_torch_error, run

pytest.importorskip("torch", reason="needs torch, not installed here")

ID = "cp-gemma3"
BOTH = "cp-gemma3,cp-attention-mask"

CHILD = "cp_gemma3"  # tests/children/cp_gemma3.py: one rank


@pytest.fixture(scope="module", params=[1, 2], ids=["ws1", "ws2"])
def ranks(request):
    order = [ID, "", BOTH] if request.param == 1 else ["", ID, BOTH]
    return run(CHILD, request.param, order, start_disabled=order[0])


def assert_gemma_error(out, cls="Gemma3ForCausalLM"):
    assert out["shim"] and out["value_error"] and out["type"] == "UnsupportedConfigError", out
    msg = out["msg"]
    assert msg.startswith(
        f"context parallel: {cls}.forward was called inside torch.distributed.tensor.experimental.context_parallel"
    ), msg
    assert "Gemma-3 cannot run under torch's context parallel" in msg and "sliding_window=4" in msg
    assert "context-parallel size to 1" in msg and f"NRL_SHIM_DISABLE={ID}" in msg


def test_gemma3_forward_under_cp_raises_before_attention(ranks):
    results = ranks
    for rank in results:
        on = rank["none"]
        assert_gemma_error(on["gemma_long"])
        assert_gemma_error(on["gemma_short"]["outcome"])
        assert on["gemma_short"]["sdpa_calls"] == 0
        assert_gemma_error(on["gemma_long_counted"]["outcome"])
        assert on["gemma_long_counted"]["sdpa_calls"] == 0
        assert_gemma_error(on["conditional_generation"], "Gemma3ForConditionalGeneration")


def test_llama_sdpa_under_cp_gets_no_shim_error(ranks):
    results = ranks
    for rank in results:
        for phase in ("none", ID, BOTH):
            assert is_torch_error(rank[phase]["llama"], *TORCH_CPU_CP_ERRORS), (phase, rank[phase]["llama"])


def test_without_the_quirk_gemma3_meets_torch(ranks):
    results = ranks
    for rank in results:
        # Only cp-gemma3 off: long sequences still pass a mask, which cp-attention-mask reports.
        long_ = rank[ID]["gemma_long"]
        assert long_["shim"] and "was called with an attn_mask" in long_["msg"], long_
        # Short sequences: transformers 4.55+ passes no mask, so the call reaches torch, which fails on CPU with
        # its own error; transformers 4.51 builds the sliding mask anyway, which cp-attention-mask reports.
        for phase in (ID, BOTH):
            short = rank[phase]["gemma_short"]
            if short["outcome"]["shim"]:
                assert phase == ID and "was called with an attn_mask" in short["outcome"]["msg"], (phase, short)
            else:
                mask_errors = TORCH_MASK_ERRORS if phase == BOTH else ()  # 4.51 with both guards off
                assert is_torch_error(short["outcome"], *TORCH_CPU_CP_ERRORS, *mask_errors), (phase, short)
                assert short["sdpa_calls"] >= 1  # the attention ran (into torch's error): the counter does count
            assert "gemma_long_counted" not in rank[phase]


def test_nothing_changes_outside_cp(ranks):
    results = ranks
    for rank in results:
        for phase in ("none", ID, BOTH):
            assert rank[phase]["gemma_outside"] == {"ok": True, "value": [1, 16, 128]}
            assert rank[phase]["sdpa_restored"] is True
