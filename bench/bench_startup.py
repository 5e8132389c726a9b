"""Start-up cost of the shim, measured in one run and printed as ratios (a script, not a test).

1. interpreter start with NRL_SHIM=1 vs unset, no target imported   (goal: <= +3 ms)
2. `import nrl_shim`: time, and which heavy modules it pulled in      (goal: none of torch/vllm/transformers/numpy)
3. `import torch` with the shim's import hooks registered vs none     (goal: ratio <= 1.02)

Runs are interleaved (A, B, A, B, ...) so drift on a shared machine hits both sides alike; medians are reported.
Usage: python bench/bench_startup.py [--runs N]   (run it with the interpreter of the venv to measure)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HEAVY = ("torch", "vllm", "transformers", "numpy", "wrapt", "ray", "packaging", "importlib.metadata", "logging")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NRL_")}
    env.update(extra)
    return env


def _wall(cmd, env):
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def paired(cmd_a, env_a, cmd_b, env_b, runs):
    a, b = [], []
    for _ in range(runs):
        a.append(_wall(cmd_a, env_a))
        b.append(_wall(cmd_b, env_b))
    return statistics.median(a), statistics.median(b)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    py = sys.executable
    import importlib.util

    origin = importlib.util.find_spec("nrl_shim").origin
    cached = importlib.util.cache_from_source(origin)
    print(
        f"nrl_shim from {os.path.dirname(origin)}; bytecode {'present' if os.path.exists(cached) else 'MISSING'}"
        " (start-up figures assume an install that compiled it, as pip does by default)"
    )

    off, on = paired([py, "-c", "pass"], _env(), [py, "-c", "pass"], _env(NRL_SHIM="1"), args.runs)
    print(
        f"1. interpreter start: NRL_SHIM unset {off * 1e3:.1f} ms, NRL_SHIM=1 {on * 1e3:.1f} ms "
        f"-> +{(on - off) * 1e3:.2f} ms, ratio {on / off:.3f} (goal <= +3 ms)"
    )

    probe = (
        "import sys, time, json; t = time.perf_counter(); import nrl_shim; dt = time.perf_counter() - t; "
        f"print(json.dumps([dt, [m for m in {HEAVY!r} if m in sys.modules]]))"
    )
    times, pulled = [], None
    for _ in range(max(5, args.runs // 4)):
        out = subprocess.run([py, "-c", probe], env=_env(), capture_output=True, text=True, check=True).stdout
        dt, pulled = json.loads(out)
        times.append(dt)
    print(
        f"2. import nrl_shim: {statistics.median(times) * 1e3:.2f} ms; heavy modules pulled in: "
        f"{', '.join(pulled) or 'none'} (goal: none of torch, vllm, transformers, numpy)"
    )

    try:
        import torch  # noqa: F401  (only to know it is installed)
    except ImportError:
        print("3. import torch: torch not installed, skipped")
        return
    runs = max(10, args.runs // 2)
    bare, hooked = paired(
        [py, "-c", "import torch"], _env(NRL_SHIM="0"), [py, "-c", "import torch"], _env(NRL_SHIM="1"), runs
    )
    print(
        f"3. import torch: no hooks {bare * 1e3:.0f} ms, hooks registered {hooked * 1e3:.0f} ms "
        f"-> ratio {hooked / bare:.3f} (goal <= 1.02)"
    )


if __name__ == "__main__":
    main()
