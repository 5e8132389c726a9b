"""sglang-weights-probe on a real SGLang engine (`sglang.Engine`, CPU; tests/children/sglang_engine.py): updates of a
policy in training give no finding; a checkpoint reloaded from disk over the synced weights (verl's and AReaL's disk
route pointed at the starting checkpoint: TRL#5312's shape on SGLang) is named at the scheduler's next batch. The
failure is shown in the same run: after the reload the engine serves the starting checkpoint's tokens again, and
SGLang answers success. The mechanism: tests/test_probe_weights.py; vLLM's: tests/test_vllm_weights_probe.py.
"""

import sys

import pytest

from conftest import child_path, run_case
from sglang_helpers import ENGINE_KW, REAL_SGLANG, sglang_env, write_llama

ID = "sglang-weights-probe"
pytestmark = REAL_SGLANG
PROMPT = [5, 17, 42, 7, 9, 11]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang-probe")
    return write_llama(root / "a", seed=0), write_llama(root / "b", seed=1)


def _run(checkpoints, tmp_path, env):
    a, b = checkpoints
    generate = {"kind": "generate", "prompt": PROMPT, "max_tokens": 6}
    cases = [
        generate,  # a's tokens; version 0 taken at this first batch
        {"kind": "update_from_tensor", "checkpoint": b, "flush_cache": True},
        generate,  # b's tokens
        {"kind": "update_from_tensor", "checkpoint": b, "flush_cache": True},  # the same again: a re-sync
        generate,
        {"kind": "update_from_disk", "checkpoint": a},  # the starting checkpoint reloaded over the synced weights
        generate,
    ]
    out, proc = run_case(child_path("sglang_engine"), {"engine": {**ENGINE_KW, "model_path": a}, "cases": cases},
                         tmp_path, env=sglang_env(env))  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if f"[{ID}]" in line]
    print(f"SGLang {out['sglang']}: start {out['engine_start_s']:.0f} s; probe lines {lines}", file=sys.stderr)
    results = [case["result"] for case in out["cases"]]
    return {"tokens": [r["tokens"] for r in results[0::2]], "updates": results[1::2], "lines": lines}


def test_a_checkpoint_reloaded_over_the_sync_is_named(checkpoints, tmp_path):
    run = _run(checkpoints, tmp_path, {"NRL_SHIM": "1"})
    first, synced, resynced, reloaded = run["tokens"]
    assert synced != first and resynced == synced, run["tokens"]  # each update served
    assert reloaded == first, run["tokens"]  # the failure: the starting checkpoint's tokens again
    assert all(update["update"][0] for update in run["updates"]), run["updates"]  # SGLang answers success
    warnings = [line for line in run["lines"] if "WARNING" in line]
    assert len(warnings) == 1, run["lines"]  # the two updates of b say nothing; the reload is named once
    assert "refit 3 left the weights exactly as they were when loaded at start-up" in warnings[0], warnings
    assert "TP rank 0" in warnings[0]
