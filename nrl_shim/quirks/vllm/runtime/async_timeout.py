"""Bound each wait for the next output of AsyncLLM.generate() by NRL_VLLM_ASYNC_TIMEOUT_SECONDS (NeMo RL's rollout
timeout). On expiry the request is aborted in the engine and ShimTimeoutError (a TimeoutError) tells the user how to
raise the limit.

Cost: NeMo RL wraps every item in asyncio.wait_for (a task and a timer per item). Here one watchdog timer per stream
is re-armed lazily: each item only stores a deadline; the timer, when it fires, moves itself to the latest deadline,
and cancels the waiting task only when the stream really stalled (as asyncio.timeout does), which we turn into the
timeout error.

Idle under NeMo RL's own async worker when that NeMo RL bounds rollouts itself (HEAD: on its driver, with the same
variable, after a sample finished): a second, in-actor bound would fire first and change its behaviour (its handler
rewrites our error and drops the sample). The call is left alone and one INFO line says so.
"""

import sys
import time

from nrl_shim.quirks.vllm import VLLM_SINCE, VLLM_VERIFIED
from nrl_shim.settings import Variable, parse_seconds

TYPE_CHECKING = False  # not typing's: quirk modules stay stdlib-light
if TYPE_CHECKING:
    import asyncio
    import types

ID = "vllm-async-timeout"
SUMMARY = "AsyncLLM.generate: each wait for the next output bounded by NRL_VLLM_ASYNC_TIMEOUT_SECONDS; abort + error"
LINK = "https://github.com/NVIDIA-NeMo/RL/blob/main/docs/model-quirks.md#vllm-async-rollout-timeout"
LIBRARY = "vllm"
VERSIONS, VERIFIED = VLLM_SINCE, VLLM_VERIFIED
REQUIRES = ("vllm.v1.engine.async_llm:AsyncLLM.generate(prompt, sampling_params, request_id)",)
SETTINGS = (
    Variable(
        "NRL_VLLM_ASYNC_TIMEOUT_SECONDS",
        "async_timeout_s",
        parse_seconds,
        600.0,
        "positive number",
        "longest wait for each next output of an async rollout",
    ),
)

_REQUEST_ID_POSITION = 2  # generate(self, prompt, sampling_params, request_id, ...) in every release 0.8.5 - 0.33
_now = time.monotonic  # the clock asyncio's default loop uses (loop.time())


class _Watchdog:
    """One timer per stream. `deadline` is None while the consumer is not waiting for an item."""

    __slots__ = ("timeout", "deadline", "handle", "task", "loop", "expired")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.deadline: float | None = None
        self.handle: asyncio.TimerHandle | None = None
        self.task: asyncio.Task | None = None  # the consumer's task, cancelled when the stream stalls
        self.loop: asyncio.AbstractEventLoop | None = None
        self.expired = False

    def start(self) -> None:
        """Schedule the timer (first wait, or first wait after the timer found the consumer busy elsewhere)."""
        import asyncio  # here, not at the top: quirk modules stay cheap to import

        assert self.deadline is not None  # bounded() sets it before every start()
        self.loop = loop = asyncio.get_running_loop()
        self.task = asyncio.current_task(loop)
        self.handle = loop.call_at(self.deadline, self._fire)

    def _fire(self) -> None:
        deadline, loop, task = self.deadline, self.loop, self.task
        assert loop is not None and task is not None  # start() set both before scheduling this call
        if deadline is None:  # not waiting: re-armed by the next start()
            self.handle = None
            return
        if deadline > loop.time():  # items arrived since the timer was set: follow the latest deadline
            self.handle = loop.call_at(deadline, self._fire)
            return
        self.handle = None
        self.expired = True
        task.cancel()

    def close(self):
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.deadline = None


def _timeout_error(request_id, timeout):
    from nrl_shim.errors import ShimTimeoutError

    return ShimTimeoutError(
        f"vLLM request {request_id!r} produced no output for {timeout:g} s (NRL_VLLM_ASYNC_TIMEOUT_SECONDS={timeout:g}); "
        f"the request was aborted. For longer sequences, increase the timeout: "
        f"export NRL_VLLM_ASYNC_TIMEOUT_SECONDS={2 * timeout:g}"
    )


def _owned_cancellation(watchdog):
    """True when the CancelledError in hand is the watchdog's own (not the caller's task being cancelled)."""
    if not watchdog.expired:
        return False
    uncancel = getattr(watchdog.task, "uncancel", None)  # Python >= 3.11
    return uncancel is None or uncancel() == 0


async def bounded(stream, engine, request_id, timeout):
    """Yield from `stream` (an async generator), with each wait for an item bounded by `timeout` seconds."""
    from asyncio import CancelledError

    watchdog = _Watchdog(timeout)
    next_item = stream.__anext__
    now = _now
    try:
        while True:
            # The per-item fast path: store the deadline; the timer is only (re)scheduled when there is none.
            watchdog.deadline = now() + timeout
            if watchdog.handle is None:
                watchdog.start()
            try:
                item = await next_item()
            except StopAsyncIteration:
                return
            except CancelledError:
                if not _owned_cancellation(watchdog):
                    raise
                watchdog.close()
                await engine.abort(request_id)
                raise _timeout_error(request_id, timeout) from None
            watchdog.deadline = None
            yield item
    finally:
        watchdog.close()
        # The caller broke out early (GeneratorExit) or failed: close vLLM's generator now, so it aborts the request
        # and leaves nothing to the garbage collector. A no-op once it is exhausted.
        await stream.aclose()


# NeMo RL's own async vLLM worker. NeMo RL HEAD (7ea279abf) bounds its rollouts itself with this same variable, on its
# driver (VllmGeneration._generate_on_shard: asyncio.wait_for on the Ray ref of the shard's result), and leaves the
# engine stream unbounded; a second, in-actor bound would fire first and change NeMo RL's behaviour.
_NEMO_RL_WORKERS = ("nemo_rl.models.generation.vllm.vllm_worker_async",)
_nemo_rl_bounds: "dict[str, bool]" = {}  # caller module name -> whether its NeMo RL reads NRL_VLLM_ASYNC_TIMEOUT_SECONDS


def _caller_module():
    """Name of the module that called AsyncLLM.generate (wrapt's and our own frames skipped)."""
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith("wrapt") or name.startswith("nrl_shim")):
            return name
        frame = frame.f_back
    return None


def _nemo_rl_bounds_it(module_name):
    """True when `module_name` is NeMo RL's async vLLM worker and that NeMo RL reads NRL_VLLM_ASYNC_TIMEOUT_SECONDS
    itself (in the worker, or on the driver in vllm_generation.py next to it): read once per process."""
    if module_name not in _NEMO_RL_WORKERS:
        return False
    if module_name not in _nemo_rl_bounds:
        import os

        found = False
        path = getattr(sys.modules.get(module_name), "__file__", None)
        if path:
            for candidate in (path, os.path.join(os.path.dirname(path), "vllm_generation.py")):
                try:
                    with open(candidate, encoding="utf-8") as f:
                        found = found or "NRL_VLLM_ASYNC_TIMEOUT_SECONDS" in f.read()
                except OSError:
                    pass
        _nemo_rl_bounds[module_name] = found
    return _nemo_rl_bounds[module_name]


def _generate_wrapper(wrapped, instance, args, kwargs, current):
    if instance is None:
        return wrapped(*args, **kwargs)
    caller = _caller_module()
    if _nemo_rl_bounds_it(caller):
        from nrl_shim import report

        report.unchanged(
            ID,
            f"AsyncLLM.generate called by {caller}",
            "NeMo RL applies NRL_VLLM_ASYNC_TIMEOUT_SECONDS itself, on its driver; no second bound here",
        )
        return wrapped(*args, **kwargs)
    if "request_id" in kwargs:
        request_id = kwargs["request_id"]
    elif len(args) > _REQUEST_ID_POSITION:
        request_id = args[_REQUEST_ID_POSITION]
    else:
        return wrapped(*args, **kwargs)  # a call vLLM itself will reject with its own TypeError
    return bounded(wrapped(*args, **kwargs), instance, request_id, current.async_timeout_s)


def patch(module, settings):
    from nrl_shim.patching import wrap

    def generate_wrapper(wrapped, instance, args, kwargs):
        return _generate_wrapper(wrapped, instance, args, kwargs, settings)

    wrap(module.AsyncLLM, "generate", generate_wrapper, ID)


def unpatch(module):
    from nrl_shim.patching import unwrap

    unwrap(module.AsyncLLM, "generate", ID)


TARGETS = {"vllm.v1.engine.async_llm": (patch, unpatch)}


def describe(settings, version):
    return f"AsyncLLM.generate: each wait for the next output bounded by {settings.async_timeout_s:g} s"
