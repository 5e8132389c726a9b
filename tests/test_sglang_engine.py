"""A real SGLang engine on the CPU (`sglang.Engine`, tests/children/sglang_engine.py; the harness in tests/sglang_cpu):
greedy tokens against transformers; sglang-radix-cache-refit on the Engine's route, `update_weights_from_tensor`
(NeMo RL's and slime's per-bucket call, `flush_cache=False`): without the shim the prompt served before comes from the
old weights' KV; with it (NRL_SHIM=1 in the engine's processes) from the new weights; and sglang-weights-probe: a
checkpoint reloaded from disk over the synced weights (verl's and AReaL's disk route pointed at the starting checkpoint:
TRL#5312's shape on SGLang) is served with SGLang's success, and under the shim named at the scheduler's next batch,
while the updates before it say nothing. One engine start per shim setting serves every case (a start costs 30-190 s
here); the run's site-packages are hashed before and after it: the harness edits no installed file. The run under the
shim is in CI (the Engine route); the run without it, which shows the failures, in `nox -t full` (the server test shows
the radix failure in CI). The probe's mechanism: tests/test_probe_weights.py; vLLM's: tests/test_vllm_weights_probe.py.

Cases in order, on one engine started with checkpoint A: the 300-token prompt (its KV enters the radix cache);
`update_weights_from_tensor(B, flush_cache=False)` (inside begin_weight_update()/end_weight_update() on 0.5.21+); the
prompt again; `flush_cache()` (retried while refused, as NeMo RL does); the prompt again; B sent again (a re-sync, with
its flush); the prompt; `update_weights_from_disk(A)` (the starting checkpoint reloaded); the prompt.
"""

import sys

import pytest

from conftest import child_path, run_case
from sglang_helpers import ENGINE_KW, REAL_SGLANG, logprob_gap, reference, sglang_env, write_llama
from site_packages_hash import differences, site_packages, snapshot

PROMPT = [(i * 37) % 500 + 3 for i in range(300)]  # a long shared prefix, token ids of the tiny vocabulary
MAX_TOKENS = 8
PROBE = "sglang-weights-probe"
pytestmark = REAL_SGLANG


@pytest.fixture(scope="module", params=[pytest.param(False, marks=pytest.mark.full), True], ids=["plain", "shim"])
def run(request, tmp_path_factory):
    """The child's result (one engine, every case) with the checkpoints' references and the site-packages check."""
    root = tmp_path_factory.mktemp("sglang-engine")
    a, b = write_llama(root / "a", seed=0), write_llama(root / "b", seed=1)
    cases = [
        {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS},
        {"kind": "update_from_tensor", "checkpoint": b, "flush_cache": False},
        {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS},
        {"kind": "flush_cache", "retry_s": 60},  # NeMo RL's retries
        {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS},
        {"kind": "update_from_tensor", "checkpoint": b, "flush_cache": True},  # the same again: a re-sync
        {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS},
        {"kind": "update_from_disk", "checkpoint": a},  # the starting checkpoint reloaded over the synced weights
        {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS},
    ]
    installed = site_packages(sys.executable)
    before = snapshot(roots=installed)
    out, proc = run_case(
        child_path("sglang_engine"),
        {"engine": {"model_path": a, **ENGINE_KW}, "cases": cases},
        root,
        env=sglang_env({"NRL_SHIM": "1" if request.param else "0"}),
        timeout=900,
    )
    changed = differences(before, snapshot(roots=installed))
    shim_lines = [message for _level, message in out["start_log"]]
    shim_lines += [message for case in out["cases"] for _level, message in case["log"]]
    print(
        f"SGLang {out['sglang']}: engine start {out['engine_start_s']:.0f} s; shim active {out['shim_active']}, "
        f"its records: {shim_lines}",
        file=sys.stderr,
    )
    return {
        "shim": request.param,
        "out": out,
        "results": [case["result"] for case in out["cases"]],
        "reference_a": reference(a, PROMPT, MAX_TOKENS),
        "reference_b": reference(b, PROMPT, MAX_TOKENS),
        "site_packages_changed": changed,
        "stderr": proc.stderr,
        "probe_lines": [line for line in proc.stderr.splitlines() if f"[{PROBE}]" in line],
    }


def test_greedy_tokens_match_transformers(run):
    first = run["results"][0]
    assert first["tokens"] == run["reference_a"]["tokens"], (first, run["reference_a"])
    assert logprob_gap(first, run["reference_a"]) < 1e-3
    assert first["cached"] == 0


def test_update_succeeds(run):
    update = run["results"][1]
    assert all(update[step][0] for step in update), update  # (success, message) of begin, update, end


def test_update_without_flush_serves_new_weights_under_the_shim(run):
    if not run["shim"]:
        pytest.skip("the shim's case")
    assert run["out"]["shim_active"]
    second = run["results"][2]
    gap = logprob_gap(second, run["reference_b"])
    first_gap = abs(second["logprobs"][0] - run["reference_b"]["logprobs"][0])
    print(
        f"after the update without a flush: cached_tokens {second['cached']} of {len(PROMPT)}, first-token logprob "
        f"gap {first_gap:.3g} to transformers with the new weights (max over matching tokens {gap:.3g}); tokens "
        f"{second['tokens']} vs {run['reference_b']['tokens']}",
        file=sys.stderr,
    )
    assert second["cached"] == 0, f"{second['cached']} prompt tokens from the radix cache"
    assert second["tokens"] == run["reference_b"]["tokens"] and gap < 1e-3, (second, run["reference_b"], gap)


def test_update_without_flush_serves_old_kv_without_the_shim(run):
    """The failure the fix repairs: the prefix came from the old weights' KV (its cached tokens) and the continuation
    is not transformers' with the new weights."""
    if run["shim"]:
        pytest.skip("the case without the shim")
    assert not run["out"]["shim_active"]
    second = run["results"][2]
    assert second["cached"] >= len(PROMPT) - 1
    assert logprob_gap(second, run["reference_b"]) > 0.05


def test_flush_then_new_weights_exact(run):
    flushed, third = run["results"][3], run["results"][4]
    print(f"flush_cache attempts: {flushed['attempts']}", file=sys.stderr)  # 0.5.12.post1 may refuse the first
    assert flushed["success"]
    assert third["cached"] == 0
    assert third["tokens"] == run["reference_b"]["tokens"]
    assert logprob_gap(third, run["reference_b"]) < 1e-3


def test_site_packages_untouched(run):
    """The harness (stand-ins on PYTHONPATH, torchvision's op schemas defined in memory) edits no installed file."""
    assert run["site_packages_changed"] == []


def test_a_checkpoint_reloaded_over_the_sync_is_served_and_named_by_the_probe(run):
    """The reload is served with SGLang's success (the starting checkpoint's tokens again: the failure, in both runs);
    under the shim the probe names it once, and the two updates of B before it (a sync, a re-sync) say nothing."""
    resynced, reload, reloaded = run["results"][5], run["results"][7], run["results"][8]
    assert run["results"][6]["tokens"] == run["reference_b"]["tokens"], run["results"][6]  # the re-sync served
    assert all(resynced[step][0] for step in resynced), resynced
    assert reload["update"][0], reload  # SGLang answers success
    assert reloaded["tokens"] == run["reference_a"]["tokens"], (reloaded, run["reference_a"])
    print(f"probe lines: {run['probe_lines']}", file=sys.stderr)
    warnings = [line for line in run["probe_lines"] if "WARNING" in line]
    if not run["shim"]:
        assert run["probe_lines"] == [], run["probe_lines"]
        return
    assert len(warnings) == 1, run["probe_lines"]
    assert "refit 3 left the weights exactly as they were when loaded at start-up" in warnings[0], warnings
    assert "TP rank 0" in warnings[0]
