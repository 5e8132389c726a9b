"""SGLang's release and resume of GPU memory act once per tag: a tag asked for again is skipped, not repeated or fatal.

RL frameworks give the GPU to the trainer between rollouts: `release_memory_occupation(tags)` pauses the memory
saver's regions (weights, KV cache, CUDA graphs), `resume_memory_occupation(tags)` maps them back; both take a list of
tags or none (all of them). SGLang's scheduler keeps the released tags in `offload_tags` and does each step
unconditionally (read in every wheel 0.5.10.post1 -> 0.5.23, the mixin up to 0.5.12, SchedulerWeightUpdaterManager
from 0.5.13):
- a resume of a tag not released (a second resume, a resume before any release, `resume()` of all tags after a
  partial one) is `offload_tags.remove(tag)` of a missing tag: KeyError in the scheduler, which takes the server down
  (measured on the CPU engine: 0.5.23, 0.5.15.post1, 0.5.12.post1, 0.5.10.post1);
- a release of weights already released stashes the model's non-parameter buffers (rotary tables and the like) again,
  now from the paused memory, for the resume to restore: with torch_memory_saver that memory is unmapped (read in its
  source and SGLang's, not run: no CUDA here; the test harness's stand-in leaves paused memory readable, and there
  the second release was harmless).
slime carries the same fix as a patch of SGLang in its image (docker/patch/v0.5.15.post1/sglang-release_hicache.patch).

The fix, in each scheduler process (every TP/DP rank gets the same request and holds the same tags, so the barriers
inside stay matched): a release goes on with the tags not released yet, a resume with the tags released; a tag
asked for in the state it is already in is left out, and a call with none left answers success without touching
memory. One WARNING per process and kind names the tags left out (DEBUG after). Calls that ask for each tag once are
passed through as they are.
"""

from nrl_shim.quirks.sglang import SGLANG_SINCE, SGLANG_VERIFIED, _weight_updates

ID = "sglang-release-resume-idempotent"
SUMMARY = (
    "SGLang release/resume_memory_occupation act once per tag: a tag already released (or not released) is skipped, "
    "not paused twice (buffers stashed from freed memory) or resumed twice (KeyError kills the server)"
)
LINK = "https://github.com/THUDM/slime/blob/624b824a898ab0ec1fcb4d373004c7f3852bf515/docker/patch/v0.5.15.post1/sglang-release_hicache.patch"
LIBRARY = "sglang"
# Read in the wheels 0.5.10.post1, 0.5.12.post1, 0.5.15.post1, 0.5.18, 0.5.21 and 0.5.23 (offload_tags, the tags'
# defaults GPU_MEMORY_ALL_TYPES, the outputs); run on real CPU servers of 0.5.10.post1, 0.5.12.post1, 0.5.15.post1 and
# 0.5.23. The bug exists in every release read; declared with SGLang's other fixes.
VERSIONS, VERIFIED = SGLANG_SINCE, SGLANG_VERIFIED
_HANDLERS = ("release_memory_occupation", "resume_memory_occupation")
REQUIRES = (
    *_weight_updates.requires(*_HANDLERS, routes=()),
    *(
        f"{module}:{name}"
        for module in (_weight_updates.MIXIN, _weight_updates.MANAGER)
        for name in ("GPU_MEMORY_ALL_TYPES", "ReleaseMemoryOccupationReqOutput", "ResumeMemoryOccupationReqOutput")
    ),
)
WHAT = "SGLang release/resume of GPU memory"
_SAID: set = set()


def _patch_owner(owner, settings):
    import sys

    from nrl_shim.patching import wrap

    module = sys.modules[owner.__module__]  # where the owner's handlers find SGLang's names
    wrap(owner, "release_memory_occupation", _wrapper(module, release=True), ID)
    wrap(owner, "resume_memory_occupation", _wrapper(module, release=False), ID)


def _unpatch_owner(owner):
    from nrl_shim.patching import unwrap

    for name in _HANDLERS:
        unwrap(owner, name, ID)


TARGETS = _weight_updates.targets(_patch_owner, _unpatch_owner)


def describe(settings, version):
    return "a release of tags already released, or a resume of tags not released, leaves those tags out (a warning)"


def _wrapper(module, release):
    def wrapper(wrapped, instance, args, kwargs):
        recv_req = kwargs.get("recv_req", args[0] if args else None)
        held = getattr(instance, "offload_tags", None)
        if recv_req is None or not isinstance(held, set):  # not the call this fix reads: SGLang's own answer
            return wrapped(*args, **kwargs)
        asked = list(dict.fromkeys(getattr(recv_req, "tags", None) or module.GPU_MEMORY_ALL_TYPES))
        todo = [tag for tag in asked if (tag not in held) is release]
        if len(todo) == len(asked):
            return wrapped(*args, **kwargs)
        _say(release, [tag for tag in asked if tag not in todo], todo)
        if not todo:
            return (module.ReleaseMemoryOccupationReqOutput if release else module.ResumeMemoryOccupationReqOutput)()
        import copy

        narrowed = copy.copy(recv_req)
        narrowed.tags = todo
        if "recv_req" in kwargs:
            return wrapped(**{**kwargs, "recv_req": narrowed})
        return wrapped(narrowed, *args[1:], **kwargs)

    return wrapper


def _say(release, skipped, kept):
    import logging

    from nrl_shim import report

    call, state = ("release_memory_occupation", "released") if release else ("resume_memory_occupation", "not released")
    first = call not in _SAID  # one WARNING per process and call (an RL job releases and resumes at every step)
    _SAID.add(call)
    report.record(
        ID,
        "warning",
        "[%s] %s: %s asked for %s, already %s: left out (SGLang would %s); %s (%s)",
        ID,
        WHAT,
        call,
        skipped,
        state,
        "pause them again and stash the model's buffers from the freed memory"
        if release
        else "raise KeyError in the scheduler and the server would go down",
        f"went on with {kept}" if kept else "nothing else to do: answered success",
        LINK,
        level=logging.WARNING if first else logging.DEBUG,
    )
