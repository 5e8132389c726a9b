"""README's main job on SGLang: `examples/grpo_tiny.py --engine sglang`, run as a user types it (plain python, and
`nrl-shim run --`), with the CPU harness on PYTHONPATH (tests/sglang_cpu). SGLang's HTTP server in a subprocess, a
refit before every rollout the way asynchronous RL refits SGLang: a long rollout still running, generation paused in
place, /update_weights_from_disk (with SGLang's flush), generation continued.

Without the shim: on 0.5.22+ SGLang answers the update with 400 "Weights were updated, but the cache was not flushed"
and the next rollouts take the shared prompt from the radix cache, computed with the previous weights: step 0 matches
(its refit writes the weights the server already has), the first later step whose update SGLang refused mismatches
(most runs: all three; a run whose policy saturates early may match at a later one) and the job's own check names
stale KV; on 0.5.12.post1 (NeMo RL's pin, `nox -s sglang_nemo_rl`) the scheduler asserts at the first refit and the
server dies, and the job says so. Under the shim every step matches, and the radix fix is named.
Measured on 2 cores: ~50 s a run (the server up in ~20 s).
"""

from packaging.version import Version

from sglang_helpers import REAL_SGLANG, SGLANG_VERSION, sglang_env
from vllm_helpers import run_main_job

pytestmark = REAL_SGLANG
THRESHOLD = 1.05
OPTIONS = ("--engine", "sglang")


def test_main_job_on_sglang_mismatches_without_the_shim_and_matches_with_it(tmp_path):
    record = {}
    proc, errors = run_main_job(tmp_path, False, *OPTIONS, env=sglang_env(), record=record)
    out = proc.stdout
    assert "nrl-shim: not active" in out or "VERDICT: FAILED" in out, out + proc.stderr[-3000:]
    if Version(SGLANG_VERSION or "0") >= Version("0.5.22"):
        assert proc.returncode == 1 and "VERDICT: MISMATCH" in out, out + proc.stderr[-3000:]
        assert "weight update answered 400" in out and "cache was not flushed" in out, out
        assert len(errors) == 4 and errors[0] <= THRESHOLD, errors
        # Every mismatch comes from a refit SGLang answered 400 (the long rollout was running: the flush refused), and
        # the first such step mismatches. On a loaded machine the long rollout may be over before the pause (its stream
        # lags behind the scheduler): then the flush goes through and that step rightly matches. A later refused step
        # still takes the stale prefix but need not mismatch: SGLang's sampling is not seeded, and a run whose policy
        # saturates (every sample rewarded 1.0 from step 2 on, seen in CI) moves its logprobs too little for 1.05x.
        steps = record["steps"]
        refused = [step for step in steps[1:] if step["refit_status"] == 400]
        assert len(refused) >= 2 and all(step["cached"] > 100 for step in refused), steps
        assert refused[0]["token_mult_prob_error"] > THRESHOLD, steps
        mismatched = [step for step in steps if step["token_mult_prob_error"] > THRESHOLD]
        assert all(step["refit_status"] == 400 for step in mismatched), steps
        # The job's own check refits once more the same way, then samples with the cache as it is and after a reset:
        # after a reset the requests match; where they differ as cached, the check names stale KV. Its refit races
        # like the steps' (a loaded machine: the long rollout over before the pause, SGLang's flush through, nothing
        # stale; seen in a CI run alongside other engine tests), and then it rightly finds nothing.
        kept, fresh = record["checks"]["as cached"], record["checks"]["after reset"]
        assert fresh["at_T"] <= THRESHOLD, record["checks"]
        if kept["at_T"] > THRESHOLD:
            assert kept["cached"] > 100 and record["causes"][0].startswith("stale KV"), (record["causes"], kept)
        else:
            assert record["causes"][0].startswith("not found"), (record["causes"], kept)
    else:  # the scheduler's assert after the refused flush takes the server down
        assert proc.returncode == 2 and "VERDICT: FAILED — SGLang's server died" in out, out + proc.stderr[-3000:]
        assert "Cache flush failed after updating weights" in out, out

    record = {}
    proc, errors = run_main_job(tmp_path, True, *OPTIONS, env=sglang_env(), record=record)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert len(out.splitlines()) <= 25, out  # docs/sglang.md shows it whole
    assert "VERDICT: OK — the rollouts come from the policy at every step" in out, out
    assert len(errors) == 4 and max(errors) < THRESHOLD, errors
    assert "answered 400" not in out, out  # the update's success says what the engine serves
    assert [step["refit_status"] for step in record["steps"]] == [200] * 4, record["steps"]
    active = next(line for line in out.splitlines() if line.startswith("nrl-shim: active"))
    assert "[sglang-radix-cache-refit]" in active, active
