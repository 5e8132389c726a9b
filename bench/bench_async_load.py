"""The rollout timeout (vllm-async-timeout) under load, on a REAL AsyncLLM (vLLM's CPU build; its engine core in its
own process): many short requests through one engine, with the shim and without it (deactivated, same engine, same
process), measured in one run (a script, not a test).

    python bench/bench_async_load.py [--requests 10000] [--concurrency 256] [--max-tokens 2] [--rounds 20]

After a warm-up (WARM_UP requests each way), three passes:
  memory   tracemalloc on from before the warm-up: blocks of REQUESTS requests with the shim, without it, with it
           again; traced memory before and after each block (goal: flat, ~0 B per request), the files whose memory
           changed most, and what nrl_shim's own code allocated during the shim blocks that is still alive (goal: 0 B).
  timing   tracemalloc off: ROUNDS rounds of REQUESTS/ROUNDS requests per side, sides alternated (drift on a shared
           machine hits both): the median of the rounds' shim / plain ratios (each pair back to back), median and
           best round per side, and each side's garbage collections (a full collection of this process's heap takes
           ~0.5-1.5 s on a busy 2-core VM and lands in whichever round is running). Beside it, the wrapper alone in
           the same run (no engine): its cost per request and per item, and the ratio that cost predicts for this
           engine's time per request.
  leftover after everything: the shim's watchdog timers still scheduled, live watchdogs, tasks not there before.
Every request must complete with MAX_TOKENS tokens on both sides, or the script fails.
"""

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
os.environ.setdefault("NRL_VLLM_ASYNC_TIMEOUT_SECONDS", "60")  # on, and far above any wait here
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # the report, not the engine's start-up log

ENGINE_KW = dict(
    skip_tokenizer_init=True, dtype="float32", max_model_len=128, enforce_eager=True, gpu_memory_utilization=0.05
)
WARM_UP = 500


def prompt(i):
    return [2 + (i * 7 + j * 131) % 500 for j in range(1 + i % 5)]


class GCWatch:
    """Collections per generation and the seconds spent in them (gc.callbacks), since the last reset()."""

    def __init__(self):
        self.reset()
        self.started = None
        gc.callbacks.append(self._callback)

    def reset(self):
        self.count, self.seconds = [0, 0, 0], [0.0, 0.0, 0.0]

    def _callback(self, phase, info):
        if phase == "start":
            self.started = time.perf_counter()
        elif self.started is not None:
            self.count[info["generation"]] += 1
            self.seconds[info["generation"]] += time.perf_counter() - self.started

    def summary(self):
        return {"collections": list(self.count), "seconds": list(self.seconds)}


GC = GCWatch()


class Block:
    """`count` requests, at most `concurrency` in flight; counts what came back."""

    def __init__(self, engine, params, tag, count, concurrency, max_tokens):
        self.engine, self.params, self.tag = engine, params, tag
        self.count, self.concurrency, self.max_tokens = count, concurrency, max_tokens
        self.items = self.completed = 0
        self.gc = None

    async def _worker(self, indices):
        for i in indices:
            tokens = []
            async for output in self.engine.generate({"prompt_token_ids": prompt(i)}, self.params, f"{self.tag}-{i}"):
                self.items += 1
                tokens = output.outputs[0].token_ids
            self.completed += len(tokens) == self.max_tokens

    async def run(self):
        indices = iter(range(self.count))
        GC.reset()
        start = time.perf_counter()
        await asyncio.gather(*(self._worker(indices) for _ in range(min(self.concurrency, self.count))))
        elapsed = time.perf_counter() - start
        self.gc = GC.summary()
        if self.completed != self.count:
            raise SystemExit(f"{self.tag}: only {self.completed} of {self.count} requests completed in full")
        return elapsed


def leftovers(baseline):
    from nrl_shim.quirks.vllm.runtime.async_timeout import _Watchdog

    gc.collect()
    loop = asyncio.get_running_loop()
    timers = sum(
        not h.cancelled() and isinstance(getattr(h._callback, "__self__", None), _Watchdog) for h in loop._scheduled
    )
    watchdogs = sum(isinstance(o, _Watchdog) for o in gc.get_objects())
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and t not in baseline]
    return {"watchdog_timers": timers, "watchdogs_alive": watchdogs, "new_tasks": len(tasks)}


def traced():
    gc.collect()
    return tracemalloc.get_traced_memory()[0], tracemalloc.take_snapshot()


def shim_bytes(after, before):
    """Bytes allocated by nrl_shim's own code that are alive in `after` and were not in `before`."""
    shim_dir = os.path.join(ROOT, "nrl_shim")
    diff = after.compare_to(before, "filename")
    return sum(s.size_diff for s in diff if s.traceback[0].filename.startswith(shim_dir))


def top_growth(after, before, n=3):
    return [
        f"{s.traceback[0].filename.replace(ROOT, '.')}: {s.size_diff / 1e3:+.1f} kB"
        for s in after.compare_to(before, "filename")[:n]
    ]


async def bench(model, args):
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    import nrl_shim

    nrl_shim.activate()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **ENGINE_KW))
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True, detokenize=False)
    baseline = set(asyncio.all_tasks())
    total = 0

    def side(shim_on):
        if shim_on != nrl_shim.is_active():
            (nrl_shim.activate if shim_on else nrl_shim.deactivate)()

    async def block(tag, count, shim_on):
        nonlocal total
        side(shim_on)
        b = Block(engine, params, tag, count, args.concurrency, args.max_tokens)
        elapsed = await b.run()
        total += count
        return b, elapsed

    try:
        # memory: tracemalloc on from before the warm-up (vLLM allocates lazily on its first requests)
        tracemalloc.start()
        await block("warm-shim", WARM_UP, True)
        await block("warm-plain", WARM_UP, False)
        memory, alive, growth_sites = [], 0, None
        for tag, shim_on in (("shim", True), ("plain", False), ("shim again", True)):
            side(shim_on)  # switching sides allocates (wrappers, settings): not the block's own
            before, snapshot_before = traced()
            await block(f"mem-{tag.replace(' ', '-')}", args.requests, shim_on)
            after, snapshot_after = traced()
            memory.append((tag, before, after))
            if shim_on:
                alive += shim_bytes(snapshot_after, snapshot_before)
                growth_sites = growth_sites or top_growth(snapshot_after, snapshot_before)
            del snapshot_before, snapshot_after
        tracemalloc.stop()

        # timing
        per = args.requests // args.rounds
        times, items, gcs = {True: [], False: []}, {True: 0, False: 0}, {True: [], False: []}
        for r in range(args.rounds):
            for shim_on in (True, False) if r % 2 == 0 else (False, True):
                b, elapsed = await block(f"t{r}-{'shim' if shim_on else 'plain'}", per, shim_on)
                times[shim_on].append(elapsed)
                items[shim_on] += b.items
                gcs[shim_on].append(b.gc)
        side(True)
        left = leftovers(baseline)
    finally:
        engine.shutdown()
    return {
        "requests": args.requests,
        "total_requests": total,
        "memory": memory,
        "growth_sites_first_shim_block": growth_sites,
        "shim_alive_bytes": alive,
        "per_round": per,
        "times": {"shim": times[True], "plain": times[False]},
        "items": {"shim": items[True], "plain": items[False]},
        "gc": {"shim": gcs[True], "plain": gcs[False]},
        "left": left,
    }


def report(out, args):
    n, per = out["requests"], out["per_round"]
    print(
        f"vllm-async-timeout under load: real AsyncLLM (CPU build), {args.concurrency} in flight, "
        f"max_tokens={args.max_tokens}, {out['total_requests']} requests in all"
    )
    print(f"memory (tracemalloc on from before the warm-up; traced memory before and after blocks of {n} requests):")
    for tag, before, after in out["memory"]:
        print(
            f"  {tag:11} {before / 1e6:8.3f} MB -> {after / 1e6:8.3f} MB   {(after - before) / 1e3:+8.1f} kB "
            f"({(after - before) / n:+.2f} B/request)"
        )
    print(f"  largest changes in the first shim block, by file: {'; '.join(out['growth_sites_first_shim_block'])}")
    print(
        "  allocated by nrl_shim's code during the shim blocks and still alive after them: "
        f"{out['shim_alive_bytes']} B (goal: 0)"
    )
    print(f"timing ({args.rounds} rounds x {per} requests per side, alternated):")
    stats = {}
    for side in ("shim", "plain"):
        t = out["times"][side]
        items = out["items"][side] / args.rounds
        gcs = out["gc"][side]
        collections = [sum(g["collections"][i] for g in gcs) for i in range(3)]
        gc_seconds = sum(sum(g["seconds"]) for g in gcs)
        median, best = statistics.median(t), min(t)
        stats[side] = (median, best)
        print(
            f"  {side:6} median {median:6.3f} s/round ({median / per * 1e6:6.1f} us/request, "
            f"{items / per:.2f} items/request); best {best:6.3f} s; "
            f"GC: {collections[0]}/{collections[1]}/{collections[2]} collections (gen 0/1/2), {gc_seconds:.2f} s"
        )
    (ms, bs), (mp, bp) = stats["shim"], stats["plain"]
    paired = statistics.median(a / b for a, b in zip(out["times"]["shim"], out["times"]["plain"]))
    print(
        f"  ratio shim / plain: {paired:.3f} (median of the rounds' back-to-back pairs); of the medians {ms / mp:.3f}, "
        f"of the best rounds {bs / bp:.3f}; difference per request (medians) {(ms - mp) / per * 1e6:+.1f} us "
        "(engine and machine noise included)"
    )
    alone = out["wrapper_alone"]
    plain_us = mp / per * 1e6
    print(
        f"  the wrapper alone, same run (no engine): {alone['per_request_us']:.2f} us per request "
        f"({args.max_tokens}-item streams), {alone['per_item_us']:.3f} us per item (long streams): expected ratio "
        f"{1 + alone['per_request_us'] / plain_us:.3f} against this engine's {plain_us:.0f} us per request"
    )
    left = out["left"]
    print(
        f"left behind after {out['total_requests']} requests: {left['watchdog_timers']} timers scheduled, "
        f"{left['watchdogs_alive']} watchdogs alive, {left['new_tasks']} new tasks (goal: 0)"
    )


async def _source(n):
    for i in range(n):
        yield i


class _NeverAborts:
    async def abort(self, request_id):
        raise AssertionError("the benchmark stream never stalls")


def wrapper_alone(items_per_request, streams=20_000, long_items=200_000, repeats=5):
    """bounded() around a plain async generator vs the generator alone: its cost per request (short streams, as
    the engine's) and per item (one long stream); best of `repeats`, sides interleaved."""
    from nrl_shim.quirks.vllm.runtime.async_timeout import bounded

    async def bare(count, n):
        for _ in range(count):
            async for _ in _source(n):
                pass

    async def wrapped(count, n):
        for _ in range(count):
            async for _ in bounded(_source(n), _NeverAborts(), "bench", 600.0):
                pass

    loop = asyncio.new_event_loop()
    best = {}
    try:
        for _ in range(repeats):
            for name, fn, count, n in (
                ("bare", bare, streams, items_per_request),
                ("wrapped", wrapped, streams, items_per_request),
                ("bare_long", bare, 1, long_items),
                ("wrapped_long", wrapped, 1, long_items),
            ):
                start = time.perf_counter()
                loop.run_until_complete(fn(count, n))
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
    finally:
        loop.close()
    return {
        "per_request_us": (best["wrapped"] - best["bare"]) / streams * 1e6,
        "per_item_us": (best["wrapped_long"] - best["bare_long"]) / long_items * 1e6,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", help="also write the measurements to this file")
    args = parser.parse_args(argv)
    from tiny_models import write_model

    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(os.path.join(tmp, "llama"), "llama")
        out = asyncio.run(bench(model, args))
    out["wrapper_alone"] = wrapper_alone(args.max_tokens)
    report(out, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)
    return 0


if __name__ == "__main__":  # AsyncLLM spawns its engine core, which re-imports this module
    sys.exit(main())
