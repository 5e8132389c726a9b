"""vllm-async-timeout: each wait for the next output of AsyncLLM.generate() is bounded by
NRL_VLLM_ASYNC_TIMEOUT_SECONDS; on expiry the request is aborted and ShimTimeoutError (a TimeoutError) says how to
raise the limit.

The real AsyncLLM cannot run on a CPU. tests/children/vllm_async_generate.py therefore drives the REAL `AsyncLLM.generate` of this
venv's vLLM (every release's signature, keyword-only arguments after request_id from 0.11.2 on) with only the
engine-side output stream replaced by a controllable fake, and aborts recorded by fake engine-core objects.
"""

import asyncio
import sys

import pytest

from nrl_shim import ShimError, ShimTimeoutError
from nrl_shim.quirks.vllm.runtime import async_timeout as quirk

from conftest import run_child_json
from vllm_helpers import requires_vllm

TIMEOUT = "0.3"


@requires_vllm
def test_real_generate_with_a_fake_engine_stream():
    out, _ = run_child_json("vllm_async_generate", env={"NRL_SHIM": "1", "NRL_VLLM_ASYNC_TIMEOUT_SECONDS": TIMEOUT})
    assert out["wrapped"] and out["signature_kept"] and out["is_async_gen_function"] and out["doc_kept"]
    assert out["name"] == "generate" and out["request_id_param"] == 3  # (self, prompt, sampling_params, request_id)
    clean = {"timers": 0, "tasks": 0}

    # Normal completion: every output, nothing aborted, no timer or task left.
    assert out["complete"] == {"got": [False, False, True], "aborted": [], **clean}
    assert out["keyword"] == {"got": [True], **clean}  # request_id (and later arguments) as keywords

    # A stall: the output before it arrives, then the request is aborted and the error says what to do.
    t = out["timeout"]
    assert t["got"] == [False] and t["error"] == "ShimTimeoutError" and t["is_timeout"] and t["is_shim"]
    assert t["message"] == (
        f"vLLM request 'req-stall' produced no output for {TIMEOUT} s "
        f"(NRL_VLLM_ASYNC_TIMEOUT_SECONDS={TIMEOUT}); the request was aborted. For longer sequences, "
        f"increase the timeout: export NRL_VLLM_ASYNC_TIMEOUT_SECONDS=0.6"
    )
    assert set(t["aborted"]) == {"req-stall"}
    assert t["cancelling"] == 0 and t["timers"] == 0 and t["tasks"] == 0  # the caller's task is left usable

    # The bound is per wait, not per stream, and the caller's own time between outputs does not count.
    assert out["steady"] == {"got": 8, "aborted": [], **clean}
    assert out["busy_consumer"] == {"got": [False, False, True], "aborted": [], **clean}

    # Early break (abandoned, or closed explicitly) and the caller's task being cancelled leave nothing behind.
    assert out["early_break"] == {"abandoned": clean, "closed": clean}
    assert out["cancelled"]["outcome"] == "cancelled"  # the caller's cancellation stays a cancellation
    assert out["cancelled"]["aborted"] == ["req-cancel"]  # vLLM's own abort-on-cancel still runs
    assert out["cancelled"]["timers"] == 0 and out["cancelled"]["tasks"] == 0

    # deactivate() gives back vLLM's own generate: a stall is no longer ended by the shim.
    assert out["deactivated_wrapped"] is False
    assert out["after_deactivate"] == {"outcome": "builtins.TimeoutError"}  # the outer wait_for, not ShimTimeoutError
    # NRL_SHIM_DISABLE=vllm-async-timeout (re-activated from the environment): vLLM's own generate as well.
    assert out["disabled_wrapped"] is False and out["disabled"] == {"outcome": "builtins.TimeoutError"}
    assert out["reenabled_wrapped"] is True
    assert out["reenabled"] == {"outcome": "nrl_shim.errors.ShimTimeoutError"}


# ---------------------------------------------------------------- the wrapper alone, on plain async generators


class _Engine:
    def __init__(self):
        self.aborted = []

    async def abort(self, request_id):
        self.aborted.append(request_id)


async def _stalls_after(n):
    for i in range(n):
        yield i
    await asyncio.Event().wait()  # never set: a stuck request
    yield "never"


def test_timeout_aborts_once_and_raises_a_timeout_error():
    engine = _Engine()

    async def main():
        got = []
        with pytest.raises(TimeoutError) as info:
            async for item in quirk.bounded(_stalls_after(2), engine, "r-1", 0.05):
                got.append(item)
        return got, info.value

    got, error = asyncio.run(main())
    assert got == [0, 1] and engine.aborted == ["r-1"]
    assert isinstance(error, ShimTimeoutError) and isinstance(error, ShimError)
    assert "'r-1'" in str(error) and "export NRL_VLLM_ASYNC_TIMEOUT_SECONDS=0.1" in str(error)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.uncancel() (telling cancellations apart) is 3.11+")
def test_a_second_cancellation_during_the_timeout_stays_a_cancellation():
    # The watchdog cancels the waiting task; while that cancellation unwinds, someone else cancels the task too.
    # Their cancellation must reach the caller (as with asyncio.timeout), not be turned into our TimeoutError.
    engine = _Engine()

    async def stream():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            asyncio.current_task().cancel()  # the other party's request, made while ours is being handled
            raise
        yield "never"

    seen = []

    async def consume():
        try:
            async for _ in quirk.bounded(stream(), engine, "r-2", 0.05):
                pass
        except BaseException as exc:
            seen.append(type(exc).__name__)
            raise

    async def main():
        task = asyncio.ensure_future(consume())
        try:
            await task
        except asyncio.CancelledError:
            return task.cancelled()

    assert asyncio.run(main()) is True
    assert seen == ["CancelledError"] and engine.aborted == []


def test_pass_through_without_a_request_id():
    from nrl_shim.registry import load_settings

    async def original(*args, **kwargs):
        yield "x"

    def call(instance, args, kwargs):
        return quirk._generate_wrapper(original, instance, args, kwargs, load_settings({})).ag_code.co_name

    assert call(object(), ("p", "sp", "rid"), {}) == "bounded"
    assert call(object(), ("p", "sp"), {"request_id": "rid"}) == "bounded"
    assert call(object(), ("p",), {}) == "original"  # vLLM itself reports the missing argument
    assert call(None, ("p", "sp", "rid"), {}) == "original"


@pytest.mark.parametrize(
    "module_name, source, stands_down",
    [
        # NeMo RL HEAD: its driver bounds rollouts with the same variable (vllm_generation.py, next to the worker).
        ("nemo_rl.models.generation.vllm.vllm_worker_async", "NRL_VLLM_ASYNC_TIMEOUT_SECONDS", True),
        # A NeMo RL whose worker and driver read no such variable: the shim's bound is the only one.
        ("nemo_rl.models.generation.vllm.vllm_worker_async", "no timeout here", False),
        # Anyone else (verl, a user's script) keeps the bound, whatever their files say.
        ("verl.workers.rollout.vllm_rollout.vllm_async_server", "NRL_VLLM_ASYNC_TIMEOUT_SECONDS", False),
    ],
)
def test_stands_down_only_for_a_nemo_rl_worker_that_bounds_rollouts_itself(
    tmp_path, monkeypatch, module_name, source, stands_down
):
    import types

    worker = tmp_path / "vllm_worker_async.py"
    worker.write_text("# the async worker\n")
    (tmp_path / "vllm_generation.py").write_text(f"timeout = os.environ.get({source!r})\n")
    module = types.ModuleType(module_name)
    module.__file__ = str(worker)
    monkeypatch.setitem(sys.modules, module_name, module)
    monkeypatch.setattr(quirk, "_nemo_rl_bounds", {})
    assert quirk._nemo_rl_bounds_it(module_name) is stands_down


def test_the_caller_is_found_past_the_shims_own_frames():
    # The real path: NeMo RL's worker -> wrapt / nrl_shim.patching layers -> _generate_wrapper -> _caller_module.
    def namespace(name, **names):
        return {"__name__": name, **names}

    wrapper = namespace("nrl_shim.quirks.vllm.runtime.async_timeout", quirk=quirk)
    exec("def generate_wrapper():\n    return quirk._caller_module()\n", wrapper)
    layer = namespace("nrl_shim.patching", generate_wrapper=wrapper["generate_wrapper"])
    exec("def call():\n    return generate_wrapper()\n", layer)
    shim_wrapt = namespace("wrapt.wrappers", call=layer["call"])
    exec("def call():\n    return call_layer()\n", shim_wrapt)
    shim_wrapt["call_layer"] = layer["call"]
    worker = namespace("nemo_rl.models.generation.vllm.vllm_worker_async", call=shim_wrapt["call"])
    exec("def generate():\n    return call()\n", worker)
    assert worker["generate"]() == "nemo_rl.models.generation.vllm.vllm_worker_async"
