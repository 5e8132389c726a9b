"""Per-item cost of the vllm-async-timeout wrapper, measured in one run, printed as ratios:
the wrapper vs the bare async generator, and vs NeMo RL's pattern (asyncio.wait_for around every item).
Also the cached hf-config lookup of vllm-gemma-load-format.

    python bench/bench_async_timeout.py [--items 200000]

Goals: wrapper overhead <= 0.25 us/item and >= 40x cheaper than wait_for; cached hf-config lookup <= 0.1 ms.
"""

import argparse
import asyncio
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("NRL_SHIM", "0")  # no activation needed: we time the wrapper function itself

from nrl_shim.explain import tiny_configs as _tiny_configs
from nrl_shim.quirks import _hf_config as hf_config  # noqa: E402
from nrl_shim.quirks.vllm.runtime.async_timeout import bounded  # noqa: E402

TIMEOUT = 600.0


class _Engine:
    async def abort(self, request_id):
        raise AssertionError("the benchmark stream never stalls")


async def _stream(n):
    # Like vLLM's generate: an async generator handing over ready items (q.get_nowait() path).
    for i in range(n):
        yield i


async def _bare(n):
    async for _ in _stream(n):
        pass


async def _wrapped(n):
    async for _ in bounded(_stream(n), _Engine(), "bench", TIMEOUT):
        pass


async def _wait_for_each(n):
    it = _stream(n).__anext__
    while True:
        try:
            await asyncio.wait_for(it(), TIMEOUT)
        except StopAsyncIteration:
            return


def _per_item(loop, fn, n, repeats):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        loop.run_until_complete(fn(n))
        best = min(best, time.perf_counter() - t0)
    return best / n


def bench_timeout(items, repeats):
    loop = asyncio.new_event_loop()
    try:
        for fn in (_bare, _wrapped, _wait_for_each):  # warm-up
            loop.run_until_complete(fn(1000))
        # Interleave the three so machine noise hits them alike; keep each one's best.
        bare = wrapped = wait_for = float("inf")
        for _ in range(repeats):
            bare = min(bare, _per_item(loop, _bare, items, 1))
            wrapped = min(wrapped, _per_item(loop, _wrapped, items, 1))
            wait_for = min(wait_for, _per_item(loop, _wait_for_each, items // 10, 1))
    finally:
        loop.close()
    overhead = max(wrapped - bare, 0.0)
    wait_for_overhead = wait_for - bare
    print(f"async generate, per item ({items} items, best of {repeats}):")
    print(f"  bare generator        {bare * 1e6:8.3f} us")
    print(f"  shim wrapper          {wrapped * 1e6:8.3f} us   overhead {overhead * 1e6:.3f} us/item (goal <= 0.25)")
    print(f"  wait_for per item     {wait_for * 1e6:8.3f} us   overhead {wait_for_overhead * 1e6:.3f} us/item")
    ratio = wait_for_overhead / overhead if overhead > 0 else float("inf")
    print(f"  wrapper / bare        {wrapped / bare:8.2f}x")
    print(f"  wait_for overhead / wrapper overhead  {ratio:.0f}x cheaper (goal >= 40x)")
    return overhead, ratio


def bench_hf_config(calls):
    with tempfile.TemporaryDirectory() as tmp:
        path = _tiny_configs.write_config(os.path.join(tmp, "gemma3"), "gemma3")
        hf_config.clear_cache()
        t0 = time.perf_counter()
        assert hf_config.model_type(path) == "gemma3"
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(calls):
            hf_config.model_type(path)
        cached = (time.perf_counter() - t0) / calls
    print(f"hf-config model_type lookup: first {cold * 1e3:.3f} ms, cached {cached * 1e3:.4f} ms/call (goal <= 0.1 ms)")
    return cached


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    bench_timeout(args.items, args.repeats)
    bench_hf_config(100_000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
