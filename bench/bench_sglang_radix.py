"""The cost of sglang-radix-cache-refit in a real SGLang server (CPU, tiny Llama), in one run (a script, not a test):
GRPO-like steps (a group of 8 requests sharing a 300-token prompt: one, then the 7 others at once), a weight update
between steps, under
- `shim`: NRL_SHIM=1, `update_weights_from_disk(flush_cache=False)` (NeMo RL's and slime's way; the shim's weight
  version keeps the old KV out);
- `flush`: no shim, the update with SGLang's flush (nothing running: it succeeds);
- `no refit`: no shim, no update (the ceiling: the prompt stays cached across steps).
Per side: generated tokens/s over the steps (each group's wall time), and the prompt tokens the group's members took
from the radix cache (the first member's, and the followers' mean: what they share of the prompt the first computed).
Measured before (all 8 at once): SGLang prefills them in one batch and none shares another's prompt, with or without
a flush; so the first goes ahead here, as a framework's prefix warm-up would. Ratios are tokens/s relative to `no refit` (goal: `shim` >= 0.95).
Each side is one server start (30-300 s here); the three run at once, step for step on the same machine, so a load
from elsewhere slows all three alike; the first step of each is a warm-up, not counted.
Usage: python bench/bench_sglang_radix.py [--steps N] [--tokens T]   (with the interpreter of `nox -s sglang`'s venv)
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
sys.path.insert(0, TESTS)

PROMPT = [(i * 37) % 500 + 3 for i in range(300)]
GROUP = 8


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=64)
    options = parser.parse_args()

    from conftest import child_path, run_case
    from sglang_helpers import sglang_env, write_llama
    from sglang_runs import _server_args

    root = Path(tempfile.mkdtemp(prefix="nrl-shim-bench-sglang-"))
    a, b = write_llama(root / "a", seed=0), write_llama(root / "b", seed=1)
    sides = {
        "shim": ({"NRL_SHIM": "1"}, {"flush_cache": False}),
        "flush": ({"NRL_SHIM": "0"}, {"flush_cache": True}),
        "no refit": ({"NRL_SHIM": "0"}, None),
    }
    import threading

    outputs = {}

    def run(side, env, update):
        cases = []
        for step in range(options.steps):
            cases.append({"kind": "group", "prompt": PROMPT, "n": GROUP, "max_tokens": options.tokens, "lead": True})
            if update is not None:
                cases.append({"kind": "update_from_disk", "model_path": b if step % 2 == 0 else a, **update})
        outputs[side], _ = run_case(
            child_path("sglang_server"),
            {"model_path": a, "args": _server_args(), "cases": cases},
            root,
            env=sglang_env({**env, "NRL_SHIM_LOG_LEVEL": "WARNING"}),
            name=side.replace(" ", "_"),
            timeout=1800,
        )

    print(f"starting {len(sides)} servers, {options.steps} steps each ...", file=sys.stderr, flush=True)
    threads = [threading.Thread(target=run, args=(side, *spec)) for side, spec in sides.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results = {}
    for side in sides:
        groups = [case["result"] for case in outputs[side]["cases"] if "cached" in case["result"]][1:]  # warm-up out
        results[side] = {
            "tokens_per_s": sum(g["tokens"] for g in groups) / sum(g["seconds"] for g in groups),
            "first_cached": statistics.mean(g["cached"][0] for g in groups),
            "followers_cached": statistics.mean(statistics.mean(g["cached"][1:]) for g in groups),
            "cached_per_step": [g["cached"] for g in groups],
        }
        print(f"{side}: {json.dumps(results[side])}", file=sys.stderr, flush=True)
    base = results["no refit"]["tokens_per_s"]
    print(
        f"SGLang radix fix, {options.steps - 1} steps of a group of {GROUP} x {options.tokens} tokens, 300-token prompt:"
    )
    for side, result in results.items():
        print(
            f"  {side:9s} {result['tokens_per_s']:8.1f} tokens/s  ratio {result['tokens_per_s'] / base:5.3f}  "
            f"prompt tokens from the radix cache: first {result['first_cached']:5.1f}, followers' mean "
            f"{result['followers_cached']:5.1f} (of {len(PROMPT)})"
        )


if __name__ == "__main__":
    main()
