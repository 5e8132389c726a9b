"""Child side of test_vllm_async_timeout.py: drives the REAL `AsyncLLM.generate` of the installed vLLM. No arguments;
the timeout is NRL_VLLM_ASYNC_TIMEOUT_SECONDS.

A real AsyncLLM cannot run on a CPU, so only its engine side is replaced: the instance is made without __init__
(no engine process) and its `add_request` hands back a controllable fake output stream (the RequestOutputCollector
vLLM's generate reads with get_nowait()/get()); `output_processor` / `engine_core` are fakes that record aborts.
Everything between - generate()'s own loop, its abort-on-cancel handling and the shim's wrapper - is the real code.
Prints one JSON document: scenario name -> observations.
"""

import asyncio
import inspect
import json
import os
from types import SimpleNamespace


class FakeStream:
    """Engine-side output stream: the test puts outputs in, vLLM's generate() takes them out."""

    def __init__(self, request_id):
        self.request_id = request_id  # vLLM >= 0.2x aborts by q.request_id
        self.queue = asyncio.Queue()

    def put(self, output):
        self.queue.put_nowait(output)

    def get_nowait(self):
        try:
            return self.queue.get_nowait()
        except asyncio.QueueEmpty:
            return None

    async def get(self):
        return await self.queue.get()

    def close(self):  # vLLM >= 0.2x closes its collector when generate() ends
        pass


def make_engine():
    from vllm.v1.engine.async_llm import AsyncLLM

    aborted = []

    class OutputProcessor:
        def abort_requests(self, request_ids, internal=False):
            aborted.extend(request_ids)
            return list(request_ids)

    class EngineCore:
        async def abort_requests_async(self, request_ids):
            pass

        def shutdown(self, timeout=None):
            pass

    engine = AsyncLLM.__new__(AsyncLLM)  # no __init__: no engine-core process, no GPU
    engine.__dict__.update(
        log_requests=False,
        output_processor=OutputProcessor(),
        engine_core=EngineCore(),
        output_handler=SimpleNamespace(done=lambda: True, cancel=lambda: None),  # "already running" for generate()
        vllm_config=SimpleNamespace(cache_config=SimpleNamespace(kv_sharing_fast_prefill=False)),
        model_config=SimpleNamespace(max_model_len=1024),
        renderer=None,
    )
    streams = {}

    async def add_request(request_id, *args, **kwargs):
        return streams.setdefault(request_id, FakeStream(request_id))

    engine.add_request = add_request
    engine.streams, engine.aborted = streams, aborted
    return engine


def output(finished=False):
    from vllm.outputs import RequestOutput

    out = RequestOutput.__new__(RequestOutput)  # generate() only reads .finished (and checks the type on >= 0.11.2)
    out.finished = finished
    return out


def leftovers():
    """Our watchdog timers still scheduled, and tasks other than the current one."""
    from nrl_shim.quirks.vllm.runtime.async_timeout import _Watchdog

    loop = asyncio.get_running_loop()
    timers = [
        h
        for h in loop._scheduled
        if not h.cancelled() and isinstance(getattr(h._callback, "__self__", None), _Watchdog)
    ]
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    return {"timers": len(timers), "tasks": len(tasks)}


async def settle():
    # Let the loop run the async-generator finalizer (aclose of an abandoned stream) and any abort it awaits.
    for _ in range(20):
        await asyncio.sleep(0)


def sampling_params():
    from vllm import SamplingParams

    return SamplingParams(max_tokens=4)


async def scenario_complete(engine):
    gen = engine.generate("hi", sampling_params(), "req-complete")
    stream_ready = asyncio.ensure_future(_feed(engine, "req-complete", [False, False, True]))
    got = [o.finished async for o in gen]
    await stream_ready
    await settle()
    return {"got": got, "aborted": list(engine.aborted), **leftovers()}


async def _feed(engine, request_id, finished_flags, gap=0.0):
    while request_id not in engine.streams:
        await asyncio.sleep(0)
    for flag in finished_flags:
        if gap:
            await asyncio.sleep(gap)
        engine.streams[request_id].put(output(flag))


async def scenario_keyword_request_id(engine):
    gen = engine.generate("hi", sampling_params(), request_id="req-kw", priority=0)
    feeder = asyncio.ensure_future(_feed(engine, "req-kw", [True]))
    got = [o.finished async for o in gen]
    await feeder
    return {"got": got, **leftovers()}


async def scenario_timeout(engine, timeout):
    gen = engine.generate("hi", sampling_params(), "req-stall")
    feeder = asyncio.ensure_future(_feed(engine, "req-stall", [False]))  # one output, then nothing
    got, error = [], None
    try:
        async for o in gen:
            got.append(o.finished)
    except Exception as exc:
        error = exc
    await feeder
    task = asyncio.current_task()
    await asyncio.sleep(0)  # the caller's task is usable again: no stray cancellation left on it
    from nrl_shim import ShimError

    return {
        "got": got,
        "error": type(error).__name__ if error else None,
        "message": str(error) if error else None,
        "is_timeout": isinstance(error, TimeoutError),
        "is_shim": isinstance(error, ShimError),
        "aborted": list(engine.aborted),
        "cancelling": task.cancelling(),
        **leftovers(),
    }


async def scenario_slow_but_steady(engine, timeout):
    # Many outputs, each well within the timeout, the whole stream far longer than it: the bound is per gap.
    n = 8
    gen = engine.generate("hi", sampling_params(), "req-steady")
    feeder = asyncio.ensure_future(_feed(engine, "req-steady", [False] * (n - 1) + [True], gap=timeout / 4))
    got = [o.finished async for o in gen]
    await feeder
    return {"got": len(got), "aborted": list(engine.aborted), **leftovers()}


async def scenario_slow_consumer(engine, timeout):
    # The caller's own work between outputs does not count: it is not waiting for vLLM then.
    gen = engine.generate("hi", sampling_params(), "req-busy")
    engine_stream_fed = asyncio.ensure_future(_feed(engine, "req-busy", [False, False, True]))
    got = []
    async for o in gen:
        got.append(o.finished)
        await asyncio.sleep(timeout * 3)
    await engine_stream_fed
    return {"got": got, "aborted": list(engine.aborted), **leftovers()}


async def scenario_early_break(engine):
    gen = engine.generate("hi", sampling_params(), "req-break")
    feeder = asyncio.ensure_future(_feed(engine, "req-break", [False, False, True]))
    async for _ in gen:
        break
    await feeder
    del gen  # abandoned, as `async for ...: break` leaves it
    await settle()
    after_abandon = leftovers()
    gen2 = engine.generate("hi", sampling_params(), "req-break-2")
    feeder = asyncio.ensure_future(_feed(engine, "req-break-2", [False, True]))
    async for _ in gen2:
        break
    await gen2.aclose()  # closed explicitly: clean at once
    closed_at_once = leftovers()
    await feeder
    return {"abandoned": after_abandon, "closed": closed_at_once}


async def scenario_caller_cancelled(engine):
    gen = engine.generate("hi", sampling_params(), "req-cancel")
    started = asyncio.Event()

    async def consume():
        async for _ in gen:
            started.set()

    task = asyncio.ensure_future(consume())
    await _feed(engine, "req-cancel", [False])
    await started.wait()
    task.cancel()
    try:
        await task
        outcome = "finished"
    except asyncio.CancelledError:
        outcome = "cancelled"
    except Exception as exc:
        outcome = type(exc).__name__
    await settle()
    return {"outcome": outcome, "aborted": list(engine.aborted), **leftovers()}


async def scenario_unbounded(engine, timeout):
    # A stall: with the quirk on, ShimTimeoutError; disabled or off, nothing ends it but an outer wait_for.
    gen = engine.generate("hi", sampling_params(), "req-unbounded")
    feeder = asyncio.ensure_future(_feed(engine, "req-unbounded", [False]))

    async def consume():
        async for _ in gen:
            pass

    try:
        await asyncio.wait_for(consume(), timeout * 6)
        outcome = "finished"
    except Exception as exc:
        outcome = type(exc).__module__ + "." + type(exc).__name__
    await feeder
    return {"outcome": outcome}


def run(scenario, *args):
    engine = make_engine()
    return asyncio.run(scenario(engine, *args))


def main():
    from vllm.v1.engine.async_llm import AsyncLLM

    import nrl_shim
    from nrl_shim.patching import is_wrapped

    timeout = float(os.environ.get("NRL_VLLM_ASYNC_TIMEOUT_SECONDS", "600"))
    original = inspect.unwrap(AsyncLLM.generate)
    out = {
        "wrapped": is_wrapped(AsyncLLM, "generate", "vllm-async-timeout"),
        "signature_kept": inspect.signature(AsyncLLM.generate) == inspect.signature(original),
        "is_async_gen_function": inspect.isasyncgenfunction(AsyncLLM.generate),
        "name": AsyncLLM.generate.__name__,
        "doc_kept": AsyncLLM.generate.__doc__ == original.__doc__,
        "request_id_param": list(inspect.signature(original).parameters).index("request_id"),
    }
    out.update(
        complete=run(scenario_complete),
        keyword=run(scenario_keyword_request_id),
        timeout=run(scenario_timeout, timeout),
        steady=run(scenario_slow_but_steady, timeout),
        busy_consumer=run(scenario_slow_consumer, timeout),
        early_break=run(scenario_early_break),
        cancelled=run(scenario_caller_cancelled),
    )
    nrl_shim.deactivate()  # restores vLLM's own generate
    out["deactivated_wrapped"] = is_wrapped(AsyncLLM, "generate", "vllm-async-timeout")
    out["after_deactivate"] = run(scenario_unbounded, timeout)
    # Activated again from the environment, with the quirk disabled by NRL_SHIM_DISABLE: still vLLM's own generate.
    os.environ["NRL_SHIM_DISABLE"] = "vllm-async-timeout"
    nrl_shim.activate()
    out["disabled_wrapped"] = is_wrapped(AsyncLLM, "generate", "vllm-async-timeout")
    out["disabled"] = run(scenario_unbounded, timeout)
    del os.environ["NRL_SHIM_DISABLE"]
    nrl_shim.deactivate()
    nrl_shim.activate()  # and enabled again: bounded again
    out["reenabled_wrapped"] = is_wrapped(AsyncLLM, "generate", "vllm-async-timeout")
    out["reenabled"] = run(scenario_unbounded, timeout)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
