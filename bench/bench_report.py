"""The job report's cost on the main job, in one run (a script, not a test): `nrl-shim run -- python
examples/grpo_tiny.py` with the report on (a job directory, every process recording) and `NRL_SHIM_REPORT_DIR=off`,
runs alternating so a busy machine slows both alike. Per run: the steps' tokens/s (rollout tokens of a step over the
step's time: refit, rollout, update), medians over steps >= 1 (step 0 warms up); then the ratio on/off and the size of
the report written. Usage: python bench/bench_report.py [--rounds N] [--steps S] (with the interpreter of a venv with
vLLM and nrl-shim).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "grpo_tiny.py")
CLI = os.path.join(os.path.dirname(sys.executable), "nrl-shim")


def say(message):
    print(f"[bench_report {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def tokens_per_step():
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    import grpo_tiny  # constants only: vLLM is imported inside its main()

    return len(grpo_tiny.PROMPTS) * grpo_tiny.GROUP_SIZE * grpo_tiny.NEW_TOKENS


def one_run(way, steps, state):
    record = os.path.join(state, f"steps-{way}-{time.time_ns()}.json")
    env = dict(os.environ, XDG_STATE_HOME=state)
    env.pop("NRL_SHIM_REPORT_DIR", None)
    if way == "off":
        env["NRL_SHIM_REPORT_DIR"] = "off"
    command = [CLI, "run", "--", sys.executable, EXAMPLE, "--steps", str(steps), "--json", record]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"the main job failed ({way}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    with open(record) as f:
        return [s["seconds"] for s in json.load(f)["steps"]][1:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    per_step = tokens_per_step()
    state = tempfile.mkdtemp(prefix="bench-report-")
    seconds = {"on": [], "off": []}
    for round_ in range(args.rounds):
        for way in ("on", "off") if round_ % 2 == 0 else ("off", "on"):
            say(f"round {round_ + 1}/{args.rounds}: report {way} ({args.steps} steps) ...")
            seconds[way] += one_run(way, args.steps, state)
    jobs = os.path.join(state, "nrl-shim", "jobs")
    files = [os.path.join(d, f) for d in (os.path.join(jobs, j) for j in os.listdir(jobs)) for f in os.listdir(d)]
    size = sum(os.path.getsize(f) for f in files) / max(1, args.rounds)
    tps = {way: per_step / statistics.median(values) for way, values in seconds.items()}
    print(f"main job: {per_step} rollout tokens per step, {args.rounds} runs x {args.steps - 1} steps per side")
    print(
        f"tokens/s (median step)   report on {tps['on']:.0f}   off {tps['off']:.0f}   ratio on/off {tps['on'] / tps['off']:.3f}"
    )
    print(f"report written per run: {size / 1024:.1f} KiB in {len(files) // max(1, args.rounds)} file(s)")


if __name__ == "__main__":
    main()
