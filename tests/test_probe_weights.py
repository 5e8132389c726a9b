"""The refit probe's mechanism (nrl_shim/probe) on real torch modules and real job-report files: each check's finding
and its silence, the digest's exactness, and the replica comparison. Engines: tests/test_vllm_weights_probe.py."""

import json

import pytest

torch = pytest.importorskip("torch")

from nrl_shim import job_report  # noqa: E402
from nrl_shim.probe import replicas  # noqa: E402
from nrl_shim.probe.weights import CHUNK, ROW, WeightsProbe, digests, tensor_digest  # noqa: E402


def small_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 4, bias=False))


def refit(probe, model, state):
    """A framework's refit: the sent items pass through the probe, then land in the model; the engine's next step."""
    probe.refit_starts()
    sent = probe.sent(list(state.items()))
    with torch.no_grad():
        for name, tensor in sent:
            model.get_parameter(name).copy_(tensor)
    return probe.refit_done()


def stepped(state, scale=0.01, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return {n: t + scale * torch.randn(t.shape, generator=generator) for n, t in state.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.bool])
def test_digest_sees_one_element_and_a_swap(dtype):
    tensor = (torch.arange(64) % 7).to(dtype)
    base = tensor_digest(tensor).tolist()
    changed = tensor.clone()
    changed[5] = (changed[5].to(torch.float32) + 1).to(dtype) if dtype != torch.bool else ~changed[5]
    swapped = tensor.clone()
    swapped[[0, 1]] = tensor[[1, 0]]  # two different values
    assert tensor_digest(changed).tolist() != base
    assert tensor_digest(swapped).tolist() != base
    assert tensor_digest(tensor.clone()).tolist() == base  # the same bits, the same digest


def test_digest_sees_swaps_within_a_row_and_within_a_column():
    """Swaps that leave every row sum (same row) or every column sum (same column) as it was."""
    tensor = torch.randn(3 * ROW, generator=torch.Generator().manual_seed(0))
    base = tensor_digest(tensor).tolist()
    same_column = tensor.clone()
    same_column[[7, 2 * ROW + 7]] = tensor[[2 * ROW + 7, 7]]
    same_row = tensor.clone()
    same_row[[ROW + 1, ROW + 9]] = tensor[[ROW + 9, ROW + 1]]
    assert tensor_digest(same_column).tolist() != base
    assert tensor_digest(same_row).tolist() != base


@pytest.mark.parametrize("length", [2 * ROW + 5, 2 * ROW + 4], ids=["odd-bytes", "whole-words"])
def test_digest_depends_on_the_bits_not_on_where_they_sit(length):
    """A 2-byte slice at an offset not 4-byte aligned (read piece by piece through a copy) and its aligned copy give one
    digest; a tensor of an odd number of 2-byte elements (its own elements' integers) too; one element changed shows."""
    view = torch.randn(length + 1, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)[1:]
    changed = view.clone()
    changed[3] = changed[3] + 1
    assert tensor_digest(view).tolist() == tensor_digest(view.clone()).tolist() != tensor_digest(changed).tolist()


def test_digest_of_a_tensor_longer_than_one_chunk_is_positional_across_chunks():
    tensor = torch.zeros(CHUNK + 10, dtype=torch.int8)
    first, second = tensor.clone(), tensor.clone()
    first[3] = 1
    second[CHUNK + 3] = 1  # the same value, one chunk later
    assert tensor_digest(first).tolist() != tensor_digest(second).tolist()


def test_a_policy_in_training_gives_no_finding_and_a_version_per_refit():
    model = small_model()
    probe = WeightsProbe(model, "test", {})
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    for step in range(1, 4):
        state = stepped(state, seed=step)
        assert refit(probe, model, state) is None
    assert refit(probe, model, state) is None  # the same tensors again: a re-sync, not a finding
    assert probe.refits == 4 and len({key for key, _ in probe.versions}) == 4


def test_weights_reloaded_over_a_sync_are_named():
    model = small_model()
    probe = WeightsProbe(model, "test", {})
    loaded = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert refit(probe, model, stepped(loaded)) is None
    finding = refit(probe, model, loaded)  # the checkpoint again
    assert finding is not None and finding.kind == "earlier weights again", finding
    assert "when loaded at start-up" in finding.what


def test_a_write_under_the_engine_is_named_at_the_next_refit():
    model = small_model()
    probe = WeightsProbe(model, "test", {})
    state = stepped({n: p.detach().clone() for n, p in model.named_parameters()})
    assert refit(probe, model, state) is None
    with torch.no_grad():
        model[1].weight.add_(1.0)  # no refit
    finding = probe.refit_starts()
    assert finding is not None and finding.kind == "changed under the engine" and "1.weight" in finding.what


def test_a_refit_that_lands_nowhere_is_named_only_when_what_was_sent_changed():
    model = small_model()
    probe = WeightsProbe(model, "test", {})
    ghost = {"9.bias": torch.zeros(4)}  # a name the model does not have: the loader skips it

    def send(items):
        probe.refit_starts()
        list(probe.sent(iter(items.items())))  # a generator, as loaders take it
        return probe.refit_done()

    assert send(ghost) is None  # first sent: nothing to compare it with
    assert send(ghost) is None  # the same again
    finding = send({"9.bias": torch.ones(4)})
    assert finding is not None and finding.kind == "landed nowhere" and "9.bias" in finding.what


def test_sent_passes_lists_on_as_they_are_and_generators_item_by_item():
    probe = WeightsProbe(small_model(), "test", {})
    items = [("a", torch.ones(2))]
    assert probe.sent(items) is items
    passed = probe.sent(iter(items))
    assert not isinstance(passed, list) and list(passed) == items


def test_digests_skip_meta_tensors():
    found = digests([("real", torch.ones(3)), ("moved", torch.empty(3, device="meta"))])
    assert list(found) == ["real"]


def write_process(directory, pid, records):
    with open(directory / f"host-{pid}.jsonl", "w") as handle:
        handle.write(json.dumps({"process": {"pid": pid, "host": "host", "role": "vllm worker"}}) + "\n")
        for record in records:
            handle.write(json.dumps({"t": 0, "note": {"probe": record}}) + "\n")


def probe_record(refit, version, rank=0):
    return {"engine": "vllm", "model_id": 1, "layout": "L", "tp_rank": rank, "dp_rank": None, "refit": refit,
            "version": version}  # fmt: skip


def test_report_names_the_replica_on_other_weights_and_the_one_behind(tmp_path):
    write_process(tmp_path, 1, [probe_record(0, "v0"), probe_record(1, "a"), probe_record(2, "b")])
    write_process(tmp_path, 2, [probe_record(0, "v0"), probe_record(1, "a"), probe_record(2, "b")])
    write_process(tmp_path, 3, [probe_record(0, "v0"), probe_record(1, "x")])  # other weights, then no refit 2
    processes, problems = job_report.gather(str(tmp_path))
    lines, findings = replicas.compare(processes)
    assert len(findings) == 2, lines
    assert "fewer refits" in findings[0] and "pid 3 " in findings[0] + " "
    assert "after refit 1" in findings[1] and "pid 3" in findings[1] and "pid 1" not in findings[1]
    assert "refit probe" in job_report.table(str(tmp_path), processes, problems)
    assert job_report.as_json(str(tmp_path), processes, problems)["probe"]["findings"] == findings


def test_report_of_replicas_in_step_says_nothing_wrong(tmp_path):
    for pid in (1, 2):  # version 0 may differ (each engine's own dummy weights): compared from refit 1
        write_process(tmp_path, pid, [probe_record(0, f"dummy{pid}"), probe_record(1, "a"), probe_record(2, "b")])
    processes, _ = job_report.gather(str(tmp_path))
    lines, findings = replicas.compare(processes)
    assert findings == [] and len(lines) == 1, lines
