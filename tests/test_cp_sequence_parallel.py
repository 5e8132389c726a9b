"""cp-sequence-parallel: after parallelize_module applied a SequenceParallel style on a real mesh (gloo, CPU, 1 and 2
ranks), entering a real context_parallel context raises the shim's error before any buffer is sharded, and applying
SequenceParallel inside CP does too. Plain tensor parallel is not affected; with the quirk disabled torch enters CP
without a word (torch's own behaviour, the silent combination NeMo RL issue #659 is about)."""

import pytest

from cp_helpers import run

pytest.importorskip("torch", reason="needs torch, not installed here")

S = 16

ID = "cp-sequence-parallel"

CHILD = "cp_sequence_parallel"  # tests/children/cp_sequence_parallel.py: one rank


@pytest.fixture(scope="module", params=[1, 2], ids=["ws1", "ws2"])
def ranks(request):
    order = [ID, ""] if request.param == 1 else ["", ID]
    return request.param, run(CHILD, request.param, order, start_disabled=order[0])


def test_cp_after_sequence_parallel_raises_before_sharding(ranks):
    world_size, results = ranks
    for rank in results:
        out = rank["none"]["sp_then_cp"]
        assert out["shim"] and out["value_error"] and out["type"] == "UnsupportedConfigError", out
        msg = out["msg"]
        assert msg.startswith(
            "context parallel + sequence parallel: torch.distributed.tensor.experimental."
            "context_parallel was entered in a process where parallelize_module applied "
            f"SequenceParallel to Sequential (submodules '1') over a mesh of size {world_size}. "
        ), msg
        assert "both shard activations along the sequence dimension" in msg
        assert "NeMo RL issue #659" in msg and "turn sequence parallel off" in msg
        assert "context-parallel size to 1" in msg and f"NRL_SHIM_DISABLE={ID}" in msg


def test_sequence_parallel_inside_cp_raises(ranks):
    world_size, results = ranks
    for rank in results:
        out = rank["none"]["cp_then_sp"]
        assert out["shim"] and out["type"] == "UnsupportedConfigError", out
        assert out["msg"].startswith(
            "context parallel + sequence parallel: parallelize_module was asked to apply "
            f"SequenceParallel to LayerNorm (the whole module) over a mesh of size "
            f"{world_size} inside torch.distributed.tensor.experimental.context_parallel"
        )


def test_plain_tp_and_released_sp_modules_are_not_affected(ranks):
    world_size, results = ranks
    for rank in results:
        for phase in ("none", ID):
            assert rank[phase]["tp_only_then_cp"] == {"ok": True, "value": [[1, S // world_size], True]}
            assert rank[phase]["sp_module_gone_then_cp"] == {"ok": True, "value": [[1, S // world_size], True]}
            assert rank[phase]["sdpa_restored"] is True


def test_without_the_quirk_torch_enters_cp_silently(ranks):
    world_size, results = ranks
    for rank in results:
        off = rank[ID]
        assert off["sp_then_cp"] == {"ok": True, "value": [[1, S // world_size], True]}
        assert off["cp_then_sp"] == {"ok": True, "value": [[1, S // world_size], True]}
