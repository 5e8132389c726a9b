"""SGLang's own handler of a caller's flush (`SchedulerFlushWrapper.handle` from 0.5.13, `Scheduler.flush_cache_wrapped`
up to 0.5.12.post1), patched by the shim in this process (NRL_SHIM=1, the CPU harness on PYTHONPATH), after one update
the radix fix counted, with SGLang's own `Req` objects as the scheduler's requests: once while one of them runs, once
when the only one left is being aborted (`to_finish` set: slime's pause in abort mode, which returns before the
scheduler drains). The scheduler's state comes from the two callables SGLang's handler is built with (its flush refuses,
it is not idle): a live scheduler can't be held in the moment between an abort and the step that finishes it (a
request's abort and the caller's flush both reach it through its socket, milliseconds apart). Prints one JSON line:
per moment, the handler's answer (success, message).
"""

import inspect
import json
import types

from sglang.srt.managers.io_struct import FlushCacheReqInput
from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req
from sglang.srt.sampling.sampling_params import SamplingParams

from nrl_shim.quirks.sglang import radix_cache_refit


def handler():
    """SGLang's handler over a scheduler that is not idle (its flush refuses, as Scheduler.flush_cache does then)."""
    try:
        from sglang.srt.managers.scheduler_components.flush_wrapper import SchedulerFlushWrapper
    except ImportError:  # up to 0.5.12.post1: a Scheduler method over the same state
        from sglang.srt.managers.scheduler import Scheduler

        state = types.SimpleNamespace(_pending_flush=None, flush_cache=lambda: False, is_fully_idle=lambda: False)
        return lambda recv_req: Scheduler.flush_cache_wrapped(state, recv_req)
    # Where the handler's answer goes differs by release (0.5.13-0.5.15 `ipc_channels`, later `send_output`); a refusal
    # is returned, never sent, so neither is used here.
    accepted = inspect.signature(SchedulerFlushWrapper).parameters
    outputs = {"send_output": print, "ipc_channels": None}
    wrapper = SchedulerFlushWrapper(
        flush_cache=lambda: False,
        is_fully_idle=lambda: False,
        **{name: value for name, value in outputs.items() if name in accepted},
    )
    return wrapper.handle


def main():
    handle = handler()
    req = Req("running", "", [3, 4, 5], SamplingParams(max_new_tokens=8))
    radix_cache_refit._new_version("update_weights_from_disk")  # the hook's call after an update
    answers = {}
    out = handle(FlushCacheReqInput())
    answers["running"] = [out.success, out.message]
    req.to_finish = FINISH_ABORT()
    out = handle(FlushCacheReqInput())
    answers["aborting"] = [out.success, out.message]
    print(json.dumps({"answers": answers}))


if __name__ == "__main__":
    main()
