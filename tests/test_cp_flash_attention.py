"""cp-flash-attention: transformers' flash-attention path (the `flash_attention_2` entry of ALL_ATTENTION_FUNCTIONS,
and a model forward dispatched to it) called inside a real context_parallel context (gloo, CPU, 1 and 2 ranks) raises
the shim's error before any flash kernel is needed (flash-attn is not installed here). Outside CP, and with the quirk
disabled, the call fails exactly as transformers fails on its own without flash-attn."""

import os

import pytest

from cp_helpers import run

pytest.importorskip("torch", reason="needs torch, not installed here")

ID = "cp-flash-attention"

CHILD = "cp_flash_attention"  # tests/children/cp_flash_attention.py: one rank


@pytest.fixture(scope="module", params=[1, 2], ids=["ws1", "ws2"])
def ranks(request):
    order = [ID, ""] if request.param == 1 else ["", ID]
    return run(CHILD, request.param, order, start_disabled=order[0])


def assert_flash_error(out):
    assert out["shim"] and out["value_error"] and out["type"] == "UnsupportedConfigError", out
    msg = out["msg"]
    assert msg.startswith(
        "context parallel: transformers' flash-attention path (attn_implementation="
        '"flash_attention_2") was called inside torch.distributed.tensor.experimental.'
        "context_parallel (query of shape (1, "
    ), msg
    assert "Sequence packing needs flash_attention_2 and context parallel needs sdpa" in msg
    assert 'attn_implementation="sdpa"' in msg and f"NRL_SHIM_DISABLE={ID}" in msg


def test_flash_path_under_cp_raises_shim_error(ranks):
    for rank in ranks:
        assert_flash_error(rank["none"]["dispatch"])
        assert_flash_error(rank["none"]["model_forward"])


def test_outside_cp_and_without_the_quirk_transformers_fails_on_its_own(ranks):
    for rank in ranks:
        # No flash-attn here: transformers' own failure, not the shim's. Which one depends on the version and even
        # on the call order (transformers 5 caches its lazy flash import: ValueError first, TypeError after).
        for out in (rank[ID]["dispatch"], rank[ID]["model_forward"], rank["none"]["outside"], rank[ID]["outside"]):
            assert not out["ok"] and not out["shim"] and "nrl_shim" not in out["where"], out
            assert f"{os.sep}transformers{os.sep}" in out["where"] or "flash" in out["msg"].lower(), out


def test_bindings_and_sdpa_restored(ranks):
    for rank in ranks:
        for phase in ("none", ID):
            assert rank[phase]["binding_synced"] is True
            assert rank[phase]["sdpa_restored"] is True
