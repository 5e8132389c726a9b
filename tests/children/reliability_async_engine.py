"""Faults and load on ONE real AsyncLLM (vLLM's CPU build; its engine core is a separate process, as in production),
for test_reliability_engines.py: `python reliability_async_engine.py MODEL_DIR`. Prints one JSON line.

The shim is activated by the environment (NRL_SHIM=1, NRL_VLLM_ASYNC_TIMEOUT_SECONDS=<load timeout>); the phases
switch it off and on in this process (deactivate/activate), as tests/vllm_engine_child.py does. "Without the shim"
streams that run at the same time as shim streams call vLLM's own AsyncLLM.generate (the function the shim wraps).

Phases, in order, on the same engine:
  load      LOAD_STREAMS concurrent streams under the shim, then the same prompts with the shim deactivated: tokens,
            completions, and what is left on the event loop afterwards (watchdog timers, tasks, async generators).
  stop_core STALL_STREAMS shim streams and one vLLM-own stream mid-generation, then SIGSTOP of the engine-core process:
            when and how each ends, what was aborted, then SIGCONT, the vLLM-own stream resumes, a new request runs.
  stop_worker the same with SIGSTOP of the executor's worker process (the process that runs the model).
  kill_core STALL_STREAMS shim streams and as many vLLM-own streams mid-generation, then SIGKILL of the engine core:
            how and when each ends; then one new request each way on the dead engine.
"""

import asyncio
import inspect
import json
import os
import signal
import sys
import time

LOAD_STREAMS = int(os.environ.get("RELIABILITY_LOAD_STREAMS", "400"))
LOAD_TOKENS = 8
STALL_STREAMS = 4
LONG_TOKENS = 120  # still generating when the fault hits (prompt <= 5 tokens + 120 < max_model_len)
STALL_TIMEOUT = float(os.environ.get("RELIABILITY_STALL_TIMEOUT", "4"))
HANG_GUARD = 60.0  # an outer bound that turns a hang of this program into a recorded outcome

ENGINE_KW = dict(
    skip_tokenizer_init=True, dtype="float32", max_model_len=128, enforce_eager=True, gpu_memory_utilization=0.05
)


def prompt(i):
    """Distinct, deterministic token-id prompts (1-5 tokens, ids 2..501 of the tiny models' 512)."""
    return [2 + (i * 7 + j * 131) % 500 for j in range(1 + i % 5)]


def params(max_tokens):
    from vllm import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)


def vllm_generate():
    """vLLM's own AsyncLLM.generate (the function under the shim's wrapper, or itself when nothing wraps it)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    return getattr(AsyncLLM.generate, "__wrapped__", AsyncLLM.generate)


class Stream:
    """One request, consumed to the end; records when each output came and how the stream ended."""

    def __init__(self, engine, request_id, prompt_ids, max_tokens, own_vllm=False):
        self.request_id = request_id
        self.tokens, self.outputs, self.last_output, self.finished = [], 0, None, False
        self.outcome, self.message, self.ended = None, None, None
        self.first_output = asyncio.Event()
        if own_vllm:
            self.gen = vllm_generate()(engine, {"prompt_token_ids": prompt_ids}, params(max_tokens), request_id)
        else:
            self.gen = engine.generate({"prompt_token_ids": prompt_ids}, params(max_tokens), request_id)
        self.task = asyncio.ensure_future(self._consume())

    async def _consume(self):
        try:
            async for output in self.gen:
                self.tokens = list(output.outputs[0].token_ids)
                self.finished = output.finished
                self.outputs += 1
                self.last_output = time.monotonic()
                self.first_output.set()
            self.outcome = "completed"
        except BaseException as exc:  # recorded, not raised: the test judges it
            self.outcome = f"{type(exc).__module__}.{type(exc).__name__}"
            self.message = str(exc)[:400]
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.ended = time.monotonic()

    def report(self, since):
        return {
            "request_id": self.request_id,
            "outcome": self.outcome,
            "message": self.message,
            "outputs": self.outputs,
            "tokens": len(self.tokens),
            "ended_after_s": None if self.ended is None else round(self.ended - since, 3),
            "silent_before_end_s": None
            if self.ended is None or self.last_output is None
            else round(self.ended - self.last_output, 3),
        }


def leftovers(baseline_tasks):
    """What finished streams left behind, once the caller dropped them: the shim's watchdog timers still scheduled on
    the loop, live watchdogs and `bounded` async generators (garbage-collected first), tasks not there before."""
    import gc

    from nrl_shim.quirks.vllm.runtime.async_timeout import _Watchdog

    gc.collect()
    loop = asyncio.get_running_loop()
    timers = [
        h
        for h in loop._scheduled
        if not h.cancelled() and isinstance(getattr(h._callback, "__self__", None), _Watchdog)
    ]
    objects = gc.get_objects()
    watchdogs = sum(isinstance(o, _Watchdog) for o in objects)
    generators = sum(inspect.isasyncgen(o) and o.ag_code.co_name == "bounded" for o in objects)
    del objects
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and t not in baseline_tasks]
    return {
        "watchdog_timers": len(timers),
        "watchdogs_alive": watchdogs,
        "shim_generators_alive": generators,
        "new_tasks": sorted(t.get_name() for t in tasks),
    }


async def settle():
    for _ in range(50):
        await asyncio.sleep(0)
    await asyncio.sleep(0.2)


async def unfinished(engine, expected=0, wait=10.0):
    deadline = time.monotonic() + wait
    while True:
        count = engine.output_processor.get_num_unfinished_requests()
        if count == expected or time.monotonic() > deadline:
            return count
        await asyncio.sleep(0.05)


def reactivate(env):
    import nrl_shim

    nrl_shim.deactivate()
    os.environ.update(env)
    nrl_shim.activate()


async def phase_load(engine, tag):
    start = time.monotonic()
    streams = [Stream(engine, f"{tag}-{i}", prompt(i), LOAD_TOKENS) for i in range(LOAD_STREAMS)]
    await asyncio.wait_for(asyncio.gather(*(s.task for s in streams), return_exceptions=True), 600)
    elapsed = time.monotonic() - start
    await settle()
    return {
        "streams": len(streams),
        "completed": sum(s.outcome == "completed" and s.finished for s in streams),
        "errors": sorted({f"{s.outcome}: {s.message}" for s in streams if s.outcome != "completed"}),
        "tokens": [s.tokens for s in streams],
        "seconds": round(elapsed, 2),
        "unfinished": await unfinished(engine),
    }


def processes(engine):
    """The engine-core process and the executor worker(s) it started."""
    import psutil

    core = engine.engine_core.resources.engine_manager.processes[0].pid
    workers = [p.pid for p in psutil.Process(core).children(recursive=True) if "Worker" in " ".join(p.cmdline())]
    return core, workers


async def started(streams):
    await asyncio.wait_for(asyncio.gather(*(s.first_output.wait() for s in streams)), 120)
    for s in streams:
        assert s.ended is None, f"{s.request_id} ended before the fault: {s.outcome}"


async def phase_stop(engine, pid, tag, aborted, reference):
    shim = [Stream(engine, f"{tag}-shim-{i}", prompt(i), LONG_TOKENS) for i in range(STALL_STREAMS)]
    own = Stream(engine, f"{tag}-vllm-own", prompt(STALL_STREAMS), LONG_TOKENS, own_vllm=True)
    await started([*shim, own])
    del aborted[:]
    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.wait([s.task for s in shim], timeout=HANG_GUARD)
        shim_done = time.monotonic() - stopped_at
        # vLLM's own stream, given as long as the shim streams' bound (timeout + 3 s) and more: still waiting?
        await asyncio.wait([own.task], timeout=max(0.0, stopped_at + STALL_TIMEOUT + 3.0 - time.monotonic()))
        own_while_stopped = {"outcome": own.outcome, "waiting_after_s": round(time.monotonic() - stopped_at, 2)}
        unfinished_while_stopped = engine.output_processor.get_num_unfinished_requests()
    finally:
        os.kill(pid, signal.SIGCONT)
    continued_at = time.monotonic()
    await asyncio.wait([own.task], timeout=HANG_GUARD)
    own_resumed_after = None if own.ended is None else round(own.ended - continued_at, 2)
    after = Stream(engine, f"{tag}-after", prompt(0), LOAD_TOKENS)
    await asyncio.wait([after.task], timeout=HANG_GUARD)
    await settle()
    return {
        "timeout": STALL_TIMEOUT,
        "shim_streams": [s.report(stopped_at) for s in shim],
        "all_shim_streams_done_after_s": round(shim_done, 3),
        "aborted": sorted(aborted),
        "vllm_own_while_stopped": own_while_stopped,
        "vllm_own": {**own.report(stopped_at), "resumed_after_sigcont_s": own_resumed_after},
        "unfinished_while_stopped": unfinished_while_stopped,
        "unfinished_after": await unfinished(engine),
        "after": {"outcome": after.outcome, "tokens_match": after.tokens == reference},
    }


async def phase_kill(engine, pid, tag):
    shim = [Stream(engine, f"{tag}-shim-{i}", prompt(i), LONG_TOKENS) for i in range(STALL_STREAMS)]
    own = [Stream(engine, f"{tag}-vllm-{i}", prompt(i), LONG_TOKENS, own_vllm=True) for i in range(STALL_STREAMS)]
    await started(shim + own)
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    await asyncio.wait([s.task for s in shim + own], timeout=HANG_GUARD)
    out = {
        "shim_streams": [s.report(killed_at) for s in shim],
        "vllm_own_streams": [s.report(killed_at) for s in own],
    }
    # A request after the engine died, each way.
    for name, own_vllm in (("new_shim", False), ("new_vllm_own", True)):
        new = Stream(engine, f"{tag}-{name}", prompt(0), LOAD_TOKENS, own_vllm=own_vllm)
        begun = time.monotonic()
        await asyncio.wait([new.task], timeout=HANG_GUARD)
        out[name] = new.report(begun)
    return out


async def main(model):
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    import nrl_shim

    t0 = time.monotonic()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **ENGINE_KW))
    out = {"engine_start_s": round(time.monotonic() - t0, 1), "shim_active": nrl_shim.is_active()}
    aborted = []
    vllm_abort = engine.abort

    async def recording_abort(request_id, internal=False):  # every abort: vLLM's own on cancel, and the shim's
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        aborted.extend(f"{rid}{' (internal)' if internal else ''}" for rid in ids)
        return await vllm_abort(request_id, internal)

    engine.abort = recording_abort
    core, workers = processes(engine)
    out["processes"] = {"front_end": os.getpid(), "engine_core": core, "workers": workers}
    baseline = set(asyncio.all_tasks())
    try:
        out["load_shim"] = await phase_load(engine, "load-shim")
        out["load_shim"]["left"] = leftovers(baseline)
        out["load_timeout_s"] = float(os.environ["NRL_VLLM_ASYNC_TIMEOUT_SECONDS"])
        nrl_shim.deactivate()
        out["load_plain"] = await phase_load(engine, "load-plain")
        reactivate({"NRL_VLLM_ASYNC_TIMEOUT_SECONDS": str(STALL_TIMEOUT)})
        reference = out["load_plain"]["tokens"][0]
        out["stop_core"] = await phase_stop(engine, core, "stop-core", aborted, reference)
        out["stop_core"]["left"] = leftovers(baseline)
        if workers:
            out["stop_worker"] = await phase_stop(engine, workers[0], "stop-worker", aborted, reference)
            out["stop_worker"]["left"] = leftovers(baseline)
        out["kill_core"] = await phase_kill(engine, core, "kill")
    finally:
        for pid in [core, *workers]:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        engine.shutdown()
    return out


if __name__ == "__main__":  # AsyncLLM spawns its engine core, which re-imports this module
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
