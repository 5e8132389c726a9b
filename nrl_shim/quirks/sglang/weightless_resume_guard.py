"""Generation after a weightless resume: a request that would run on weights whose memory came back empty is named.

RL frameworks give the GPU to the trainer between rollouts: `release_memory_occupation` (NeMo RL's sleep, verl's and
slime's offload) pauses SGLang's weights through torch_memory_saver, `resume_memory_occupation` maps their memory back,
and the trainer's update refills it. Without `--enable-weights-cpu-backup` the memory comes back without its contents
(SGLang restores the model's non-parameter state only), and nothing holds generation until the update: a request that
comes first (a resume before the refit, a refit to another engine, a failed or skipped update) is served from whatever
the fresh memory holds, status 200, no error. Measured with the test harness's CPU stand-in for torch_memory_saver
(tests/sglang_cpu: the real one needs CUDA): the 8 greedy tokens of a prompt came out as eight times token 0.

The shim cannot bring the weights back (only the trainer has them), so it names the request (the vLLM refit guard's
counterpart). In each scheduler process: the memory saver's regions are watched for the weights tag opened without a
CPU backup; a pause of that tag, then a resume, marks the weights as empty; any weight update (tensor, distributed,
disk, IPC; a failed one too: it may have written some) clears the mark. The first generation request while marked is
one WARNING naming it (once per process, as the vLLM refit guard says its finding; later ones at DEBUG); in strict mode
(NRL_SHIM_STRICT=1) each such request is aborted with that error instead, and the server keeps running. Not covered:
an update that refills only part of the weights (the first update call clears the mark: a bucketed refit cut short is
not seen), CUDA-graph and KV-cache memory (SGLang flushes and recaptures those itself).
"""

from nrl_shim.quirks.sglang import SGLANG_SINCE, SGLANG_VERIFIED, _weight_updates

ID = "sglang-weightless-resume-guard"
SUMMARY = "SGLang: a generation request after weights were resumed without a CPU backup and before any update is named"
LINK = "https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/srt/utils/torch_memory_saver_adapter.py"
LIBRARY = "sglang"
# Read in the wheels 0.5.12.post1 and 0.5.23, and found in every wheel 0.5.10 -> 0.5.23 (tools/requires_in_wheel.py):
# the adapter's region/pause/resume, the weights tag's name, the scheduler's handle_generate_request (the batch handler
# calls it per request) and the update handlers (_weight_updates); run on real CPU servers of 0.5.10.post1,
# 0.5.12.post1 and 0.5.23 with the stand-in above. The bug exists
# wherever weights can be released without a backup (every release read); declared with SGLang's other fixes.
VERSIONS, VERIFIED = SGLANG_SINCE, SGLANG_VERIFIED
_ADAPTER = "sglang.srt.utils.torch_memory_saver_adapter"
_SCHEDULER = "sglang.srt.managers.scheduler"
REQUIRES = (
    f"{_ADAPTER}:_TorchMemorySaverAdapterReal.region(tag, enable_cpu_backup)",
    f"{_ADAPTER}:_TorchMemorySaverAdapterReal.pause(tag)",
    f"{_ADAPTER}:_TorchMemorySaverAdapterReal.resume(tag)",
    f"{_SCHEDULER}:Scheduler.handle_generate_request(recv_req)",
    # the tag the weights' region is opened with, as release/resume_memory_occupation name it
    f"{_weight_updates.MIXIN}:GPU_MEMORY_TYPE_WEIGHTS",
    f"{_weight_updates.MANAGER}:GPU_MEMORY_TYPE_WEIGHTS",
    *_weight_updates.requires(),
)
WHAT = "SGLang generation after a weightless resume"
_WEIGHTS = "weights"  # GPU_MEMORY_TYPE_WEIGHTS (sglang.srt.constants) in every release read
# This process's state (one scheduler per process): tags of memory-saver regions opened without a backup; weights
# paused (their memory gone); weights resumed empty, not yet updated; strict mode.
_UNBACKED: set = set()
_SAID: set = set()
_STATE = {"paused": False, "empty": False, "strict": False}


def _patch_adapter(module, settings):
    from nrl_shim.patching import wrap

    _STATE["strict"] = settings.strict
    real = module._TorchMemorySaverAdapterReal
    wrap(real, "region", _region_wrapper, ID)
    wrap(real, "pause", _pause_wrapper, ID)
    wrap(real, "resume", _resume_wrapper, ID)


def _unpatch_adapter(module):
    from nrl_shim.patching import unwrap

    for name in ("region", "pause", "resume"):
        unwrap(module._TorchMemorySaverAdapterReal, name, ID)
    _STATE.update(paused=False, empty=False)


def _patch_scheduler(module, settings):
    from nrl_shim.patching import wrap

    _STATE["strict"] = settings.strict
    wrap(module.Scheduler, "handle_generate_request", _generate_wrapper, ID)


def _unpatch_scheduler(module):
    from nrl_shim.patching import unwrap

    unwrap(module.Scheduler, "handle_generate_request", ID)


def _patch_updates(owner, settings):
    _weight_updates.subscribe(owner, ID, _updated)  # SGLang's one "weights changed" hook


def _unpatch_updates(owner):
    _weight_updates.unsubscribe(owner, ID)


TARGETS = {
    _ADAPTER: (_patch_adapter, _unpatch_adapter),
    _SCHEDULER: (_patch_scheduler, _unpatch_scheduler),
    **_weight_updates.targets(_patch_updates, _unpatch_updates),
}


def describe(settings, version):
    return (
        "weights released without a CPU backup and resumed: the first generation request before a weight update is "
        + ("aborted with an error, as is each one after it (strict)" if settings.strict else "a warning")
    )


def _tag(args, kwargs):
    return kwargs.get("tag", args[0] if args else None)


def _region_wrapper(wrapped, instance, args, kwargs):
    backup = kwargs.get("enable_cpu_backup", args[1] if len(args) > 1 else False)
    if not backup:
        _UNBACKED.add(_tag(args, kwargs))
    return wrapped(*args, **kwargs)


def _pause_wrapper(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    if _tag(args, kwargs) in (_WEIGHTS, None):
        if _WEIGHTS in _UNBACKED:
            _STATE["paused"] = True
        else:  # SGLang keeps a CPU copy and restores it at resume: nothing for the guard
            from nrl_shim import report

            report.unchanged(ID, WHAT, "the weights' memory region has a CPU backup (--enable-weights-cpu-backup)")
    return result


def _resume_wrapper(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    if _tag(args, kwargs) in (_WEIGHTS, None) and _STATE["paused"]:
        from nrl_shim import report

        _STATE.update(paused=False, empty=True)
        # An RL job releases and resumes at every step: INFO the first time, DEBUG after.
        report.first_at_info(
            _SAID,
            "resume",
            ID,
            "info",
            "[%s] %s: weights resumed without their contents (their memory region has no CPU backup); a generation "
            "request before the next weight update will be %s (%s)",
            ID,
            WHAT,
            "aborted (strict)" if _STATE["strict"] else "named in a warning",
            LINK,
        )
    return result


def _updated(route):
    """After each weight update (a failed one may have written some tensors too): the weights are no longer empty."""
    _STATE["empty"] = False


def _message(recv_req):
    return (
        f"[{ID}] {WHAT}: request {getattr(recv_req, 'rid', '?')!r} would be served by weights whose memory came back "
        "empty: they were released (release_memory_occupation) without a CPU backup and resumed with no weight update "
        "since. Update the weights after the resume and before generating, or start SGLang with "
        f"--enable-weights-cpu-backup. See {LINK}"
    )


def _generate_wrapper(wrapped, instance, args, kwargs):
    if not _STATE["empty"]:
        return wrapped(*args, **kwargs)
    from nrl_shim import report

    recv_req = kwargs.get("recv_req", args[0] if args else None)
    message = _message(recv_req)
    if not _STATE["strict"]:
        # One WARNING per process (the vLLM refit guard's rule); each later request of the kind at DEBUG.
        import logging

        first = "generate" not in _SAID
        _SAID.add("generate")
        report.record(ID, "warning", "%s", message, level=logging.WARNING if first else logging.DEBUG)
        return wrapped(*args, **kwargs)
    result = wrapped(*args, **kwargs)
    # SGLang's own way of refusing a request it has queued (its input checks): finished with an abort, whose message
    # the client gets; the scheduler goes on.
    rid = getattr(recv_req, "rid", None)
    for req in getattr(instance, "waiting_queue", ()):
        if getattr(req, "rid", None) == rid:
            req.set_finish_with_abort(f"{message} (NRL_SHIM_STRICT=1; NRL_SHIM_DISABLE={ID} turns the guard off)")
            report.record(ID, "error", "%s", message)
            return result
    from nrl_shim.errors import RefitIncompleteError

    raise RefitIncompleteError(message + f" (NRL_SHIM_STRICT=1; NRL_SHIM_DISABLE={ID} turns the guard off)")
