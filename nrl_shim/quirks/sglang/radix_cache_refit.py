"""Stale radix cache after a weight update: no request that starts after an update reuses KV computed before it.

SGLang's radix cache keys KV by token content (and the request's `extra_key`). A weight update flushes it only when
the caller asks (`flush_cache=True`) and only when nothing runs or waits: NeMo RL and slime send each bucket with
`flush_cache=False` and flush after the last (a flush they retry, or call once); with a pause held in place (slime's,
verl's) the flush is refused after the weights changed (0.5.22+: the update returns success=False; up to 0.5.21 the
scheduler asserts and the server dies: sglang#12099, #14062, AReaL#140). Either way the next request sharing a cached
prefix (a GRPO group's prompt, a system prompt, a prompt repeated across steps) is served KV of the old weights:
measured 299 of 300 prompt tokens, logprob gap 9.6 to the new weights, no error.

How (in each scheduler process: TP and DP ranks each own a radix cache and see every update):
- A weight version per process, counted by the scheduler's update handlers (from tensor, distributed, disk, IPC;
  each call, failed ones too: a failed update may have written some tensors) and, 0.5.21+, by the end of a
  weight-update session with no tensor or distributed load in it (weights written in place by P2P/RDMA: SGLang runs
  its post-load step there, the one sign they changed).
- The version goes in front of each request's `extra_key` (SGLang's own radix-key namespace, 0.5.10+; a LoRA id
  and an elastic namespace stay at its end), so KV of one version is never matched by a request of another:
  requests created after an update, and those still waiting for their first prefill (holding no KV slot), take the
  new version; requests running at the update keep theirs and finish (their later tokens attend to KV of the old
  weights, as after SGLang's own update; what they insert stays under the old version). Requests after the update
  share the new prefix at once: no waiting for idle, no flush needed. KV of old versions is never matched again and
  is evicted like any unused prefix. Before the first update nothing changes (no version in the key).
- A flush after an update that SGLang refuses because requests run or wait: the update no longer fails for it (no
  assert; `success` stays what the weight load said, its message says the cache was kept and why that is safe).
  0.5.12+ flush in `flush_cache_after_weight_update` (wrapped); up to 0.5.11 each handler flushes inline and asserts:
  the handler then runs without the flush, and the flush SGLang would have done follows it here (after a successful
  update, as SGLang's; on 0.5.11 a draft model whose disk/IPC load failed skips it: the version keeps the old KV out
  either way).
- A flush the caller asks for by itself (`/flush_cache`, `Engine.flush_cache()`: NeMo RL's after its buckets and its
  `invalidate_kv_cache`, slime's before an update) that SGLang refuses because requests run or wait, while an update
  was counted since the last flush that went through: answered success at once (no waiting, its timeout not used),
  the cache left as it is, its message saying so (what the flush protects holds: the version keeps the old KV out of
  every later request; running ones are untouched). SGLang's own answer everywhere else: nothing to protect (no update
  since the last real flush; a flush as a "nothing runs" barrier before any update, NeMo RL's at start-up), or only
  finished or aborted requests left (the scheduler is idle a step later; a caller that releases memory after its
  flush, slime's, must not find requests there: SGLang asserts). So a 200 from /flush_cache after an update no longer
  means that nothing runs: wait for your requests before `release_memory_occupation`, as SGLang's docs ask.
  The handler: `Scheduler.flush_cache_wrapped` up to 0.5.12.post1, `SchedulerFlushWrapper.handle` from 0.5.13 (read in
  the wheels; PARTS: a release without its one is said at start-up).
Not covered: KV stores that key by tokens only, not extra_key (read in the wheels: LMCache up to 0.5.20, FlexKV,
HiCache's storage tier up to 0.5.19, the experimental C++ tree up to 0.5.20): flush those after an update. A storage
tier that does use extra_key (HiCache 0.5.20+) shared by several engines is namespaced per engine's update count:
engines updated alike share it (the RL case: every engine gets every update).
"""

from nrl_shim.quirks.sglang import SGLANG_SINCE, SGLANG_VERIFIED, _weight_updates

TYPE_CHECKING = False  # not typing's: quirk modules stay stdlib-light
if TYPE_CHECKING:
    from typing import Any

ID = "sglang-radix-cache-refit"
SUMMARY = "After a weight update, no SGLang request that starts later reuses KV of the old weights (flush or not)"
LINK = "https://github.com/sgl-project/sglang/issues/12099"
LIBRARY = "sglang"
# What the fix calls, read in every wheel 0.5.10 -> 0.5.23 (RadixKey's extra_key, Req.extra_key built from it, the
# update handlers: in the scheduler's mixin up to 0.5.12.post1, in SchedulerWeightUpdaterManager from 0.5.13; both are
# targets, one exists per release; flush_cache_after_weight_update from 0.5.12, the flush inline before) and run on
# real engines: 0.5.10.post1 (AReaL's pin), 0.5.12.post1 (NeMo RL's pin) and 0.5.23. REQUIRES (checked on releases
# past VERIFIED) keeps flush_cache_after_weight_update: a newer release is one of the 0.5.12+ line.
VERSIONS, VERIFIED = SGLANG_SINCE, SGLANG_VERIFIED
_BATCH = "sglang.srt.managers.schedule_batch"
REQUIRES = (
    f"{_BATCH}:Req.__init__",
    f"{_BATCH}:Req.finished",
    *_weight_updates.requires("flush_cache_after_weight_update"),
)
_SCHEDULER = "sglang.srt.managers.scheduler"
_FLUSH_WRAPPER = "sglang.srt.managers.scheduler_components.flush_wrapper"  # 0.5.13+
# The caller's own flush: its handler per release, and the flush every path ends in (which says the cache is clean).
_CALLER_FLUSH_OLD = "a flush the caller asks for, while requests run (Scheduler.flush_cache_wrapped)"
_CALLER_FLUSH = "a flush the caller asks for, while requests run (SchedulerFlushWrapper.handle)"
_FLUSHED = f"{_SCHEDULER}:Scheduler.flush_cache"
PARTS = {
    _CALLER_FLUSH_OLD: (f"{_SCHEDULER}:Scheduler.flush_cache_wrapped(recv_req)", _FLUSHED),
    _CALLER_FLUSH: (f"{_FLUSH_WRAPPER}:SchedulerFlushWrapper.handle(recv_req)", _FLUSHED),
}
PART_RELEASES = {_CALLER_FLUSH_OLD: "<0.5.13", _CALLER_FLUSH: ">=0.5.13"}

WHAT = "SGLang radix cache after a weight update"
_KEPT = (
    "cache not flushed: requests running or waiting; nrl-shim keeps the old weights' KV out of every request that "
    "starts after this update"
)
_TAG = "nrl-shim-weights-"  # extra_key = f"{_TAG}{version}" or f"{_TAG}{version}|{the request's own extra_key}"
# This process's weight version (one scheduler per process), the version its cache was last flushed at (a flush that
# went through), and its live requests (to re-key those still waiting).
_STATE = {"version": 0, "flushed": 0}
_LIVE: "Any" = None  # WeakSet of this process's Req objects, created on first use
_SAID: set = set()


def patch_batch(module, settings):
    from nrl_shim.patching import wrap

    wrap(module.Req, "__init__", _req_init_wrapper, ID)


def unpatch_batch(module):
    from nrl_shim.patching import unwrap

    unwrap(module.Req, "__init__", ID)
    for req in list(_LIVE or ()):  # requests in flight keep serving: their own key back
        req.extra_key = base_key(req.extra_key)
    _STATE.update(version=0, flushed=0)


def _patch_updates(owner, settings):
    from nrl_shim.patching import wrap

    # Every update, by SGLang's one "weights changed" hook (first: under the flush handling below, so a refused
    # flush is said under the new version).
    _weight_updates.subscribe(owner, ID, _new_version)
    if hasattr(owner, "flush_cache_after_weight_update"):  # 0.5.12+
        wrap(owner, "flush_cache_after_weight_update", _flush_after_update_wrapper, ID)
    else:  # up to 0.5.11: each handler flushes inline and asserts on a refusal
        _weight_updates.wrap_updates(owner, _inline_flush_update_wrapper, ID)


def _unpatch_updates(owner):
    from nrl_shim.patching import unwrap

    _weight_updates.unwrap_updates(owner, ID)
    _weight_updates.unsubscribe(owner, ID)
    if hasattr(owner, "flush_cache_after_weight_update"):
        unwrap(owner, "flush_cache_after_weight_update", ID)


def patch_scheduler(module, settings):
    from nrl_shim.patching import wrap

    wrap(module.Scheduler, "flush_cache", _flush_cache_wrapper, ID)
    if hasattr(module.Scheduler, "flush_cache_wrapped"):  # up to 0.5.12.post1 (PARTS: said where a release lacks it)
        wrap(module.Scheduler, "flush_cache_wrapped", _caller_flush_wrapper, ID)


def unpatch_scheduler(module):
    from nrl_shim.patching import unwrap

    unwrap(module.Scheduler, "flush_cache", ID)
    if hasattr(module.Scheduler, "flush_cache_wrapped"):
        unwrap(module.Scheduler, "flush_cache_wrapped", ID)


def patch_flush_wrapper(module, settings):
    from nrl_shim.patching import wrap

    # The class, before the scheduler binds `flush_wrapper.handle` into its request dispatcher.
    wrap(module.SchedulerFlushWrapper, "handle", _caller_flush_wrapper, ID)


def unpatch_flush_wrapper(module):
    from nrl_shim.patching import unwrap

    unwrap(module.SchedulerFlushWrapper, "handle", ID)


TARGETS = {
    _BATCH: (patch_batch, unpatch_batch),
    **_weight_updates.targets(_patch_updates, _unpatch_updates),
    _SCHEDULER: (patch_scheduler, unpatch_scheduler),
    _FLUSH_WRAPPER: (patch_flush_wrapper, unpatch_flush_wrapper),
}


def describe(settings, version):
    return (
        "after a weight update (tensor, distributed, disk, IPC; flushed or not): requests that start later never "
        "match KV of the old weights (weight version in the radix key); running requests keep theirs; a refused "
        "flush no longer fails the update; the caller's own flush after an update succeeds while requests run"
    )


# --- the key ---


def versioned_key(key, version):
    """`key` (a request's extra_key, None or a str) in weight version `version`'s namespace; version 0 is SGLang's own
    key (nothing before the first update)."""
    key = base_key(key)
    if version == 0:
        return key
    return f"{_TAG}{version}" if key is None else f"{_TAG}{version}|{key}"


def base_key(key):
    """The request's own extra_key, without the version this fix put in front of it."""
    if not isinstance(key, str) or not key.startswith(_TAG):
        return key
    head, bar, rest = key.partition("|")
    return rest if bar else None


def _req_init_wrapper(wrapped, instance, args, kwargs):
    global _LIVE
    wrapped(*args, **kwargs)
    try:
        if _LIVE is None:
            import weakref

            _LIVE = weakref.WeakSet()
        _LIVE.add(instance)
        if _STATE["version"]:
            instance.extra_key = versioned_key(getattr(instance, "extra_key", None), _STATE["version"])
    except Exception as error:  # never break a request over this
        from nrl_shim import report

        report.logger().debug("[%s] request not keyed: %r", ID, error)


_NO_SLOT = object()


def _holds_kv(req):
    """Whether the request holds a KV slot (started its prefill, maybe only a chunk): `req.req_pool_idx` up to 0.5.18,
    `req.kv.req_pool_idx` from 0.5.16 (both there in between). Neither found: treated as holding (its key stays, as
    for a running request)."""
    slots = (getattr(req, "req_pool_idx", _NO_SLOT), getattr(getattr(req, "kv", None), "req_pool_idx", _NO_SLOT))
    if all(slot is _NO_SLOT for slot in slots):
        return True
    return any(slot is not None and slot is not _NO_SLOT for slot in slots)


# --- the update ---


def _new_version(route):
    """After each update (the weights-changed hook, in the scheduler's loop: before it takes its next request)."""
    from nrl_shim import report

    _STATE["version"] += 1
    version = _STATE["version"]
    rekeyed = kept = 0
    for req in list(_LIVE or ()):
        try:
            if req.finished():
                continue
            if _holds_kv(req):
                kept += 1
            else:
                req.extra_key = versioned_key(req.extra_key, version)
                rekeyed += 1
        except Exception as error:  # a request of another shape: leave it
            report.logger().debug("[%s] request not re-keyed: %r", ID, error)
    report.first_at_info(
        _SAID,
        ("update", route),  # each route once: the user sees every way the weights changed was counted
        ID,
        "info",
        "[%s] %s: weights changed (%s), weight version %d: requests that start from now on (%d waiting) never match "
        "radix-cache KV of earlier weights; %d running keep theirs; not covered: KV stores keyed by tokens only "
        "(LMCache <=0.5.20, FlexKV, HiCache storage <=0.5.19, the experimental C++ tree) (%s)",
        ID,
        WHAT,
        route,
        version,
        rekeyed,
        kept,
        LINK,
    )


def _flush_after_update_wrapper(wrapped, instance, args, kwargs):
    """SGLang's flush after an update, minus its failure: the flush is tried as SGLang would; refused (requests run or
    wait), the update goes on as if it had flushed (the version keeps the old KV out of every later request)."""
    recv_req = args[0] if args else kwargs.get("recv_req")
    if not getattr(recv_req, "flush_cache", False):
        return wrapped(*args, **kwargs)
    flushed = instance.flush_cache(empty_cache=getattr(recv_req, "torch_empty_cache", True))
    if flushed:  # inside the update handler: the weights-changed hook counts this update once the handler returns
        _STATE["flushed"] = _STATE["version"] + 1
    call_args, call_kwargs = _without_flush(recv_req, args, kwargs)  # SGLang's routine, without its second flush
    result = wrapped(*call_args, **call_kwargs)
    if not flushed:
        if isinstance(result, tuple) and len(result) == 2:  # 0.5.22+: (success, message) of the update call
            result = (result[0], f"{result[1]} ({_KEPT})")
        # inside the update handler: the weights-changed hook gives this update its version once the handler returns
        _say_flush_refused("not failed/asserted", _STATE["version"] + 1)
    return result


def _without_flush(recv_req, args, kwargs):
    """The handler's arguments with a copy of `recv_req` that asks for no flush (SGLang's routine without its flush,
    and so without its assert or failure)."""
    import copy

    unflushed = copy.copy(recv_req)
    unflushed.flush_cache = False
    return ((unflushed, *args[1:]), kwargs) if args else ((), {**kwargs, "recv_req": unflushed})


def _inline_flush_update_wrapper(wrapped, instance, args, kwargs):
    """Up to 0.5.11 (no flush_cache_after_weight_update): the handler runs without its inline flush; the flush SGLang
    would have done follows here, after a successful update, a refusal said instead of asserted (AReaL#140)."""
    import inspect

    recv_req = args[0] if args else kwargs.get("recv_req")
    if not getattr(recv_req, "flush_cache", False):
        return wrapped(*args, **kwargs)
    call_args, call_kwargs = _without_flush(recv_req, args, kwargs)
    result = wrapped(*call_args, **call_kwargs)  # the weights-changed hook below: a new version, before the flush
    if not getattr(result, "success", False):
        return result
    # 0.5.11 passes the request's torch_empty_cache; 0.5.10's flush_cache takes no argument.
    if "empty_cache" in inspect.signature(instance.flush_cache).parameters:
        flushed = instance.flush_cache(empty_cache=getattr(recv_req, "torch_empty_cache", True))
    else:
        flushed = instance.flush_cache()
    if not flushed:
        if isinstance(getattr(result, "message", None), str):
            result.message = f"{result.message} ({_KEPT})"
        _say_flush_refused("not asserted", _STATE["version"])
    return result


def _say_flush_refused(instead, version):
    from nrl_shim import report

    report.first_at_info(
        _SAID,
        "refused",
        ID,
        "changed",
        "[%s] %s: flush after the update refused by SGLang (requests running or waiting): update kept as "
        "succeeded, %s; the old weights' KV stays cached under weight version %d, never matched by a request that "
        "starts after the update (%s)",
        ID,
        WHAT,
        instead,
        version,
        LINK,
    )


# --- the caller's own flush ---


def _flush_cache_wrapper(wrapped, instance, args, kwargs):
    """Scheduler.flush_cache, every flush's end (the caller's, an update's, a release's): one that went through leaves
    no KV of any earlier weights."""
    flushed = wrapped(*args, **kwargs)
    if flushed:
        _STATE["flushed"] = _STATE["version"]
    return flushed


def _live_requests():
    """This process's requests neither finished nor being finished (an abort sets `to_finish` first)."""
    live = 0
    for req in list(_LIVE or ()):
        try:
            if not req.finished() and getattr(req, "to_finish", None) is None:
                live += 1
        except Exception:  # a request of another shape: not counted
            continue
    return live


def _caller_flush_wrapper(wrapped, instance, args, kwargs):
    """The scheduler's handler of a flush the caller asks for (HTTP /flush_cache, Engine.flush_cache): refused by SGLang
    while requests run or wait after an update that was not flushed, it is answered success with the cache kept (the
    version keeps the old KV out of every later request); SGLang's answer everywhere else."""
    if _STATE["version"] == _STATE["flushed"]:  # nothing of earlier weights in the cache (or no update yet)
        return wrapped(*args, **kwargs)
    live = _live_requests()
    if not live:  # idle, or only finished/aborted requests left: SGLang's flush (or deferral) as it is
        return wrapped(*args, **kwargs)
    recv_req = args[0] if args else kwargs.get("recv_req")
    if getattr(recv_req, "timeout_s", None):  # answered now: a flush tried, not deferred until idle
        import copy

        recv_req = copy.copy(recv_req)
        recv_req.timeout_s = None
        args, kwargs = ((recv_req, *args[1:]), kwargs) if args else ((), {**kwargs, "recv_req": recv_req})
    result = wrapped(*args, **kwargs)
    # refused for running requests: success False without a message ("another flush in progress" has one)
    if result is None or getattr(result, "success", True) or getattr(result, "message", ""):
        return result
    from nrl_shim import report

    result.success = True
    result.message = (
        f"cache not flushed: {live} requests running or waiting; nrl-shim keeps KV of weights before version "
        f"{_STATE['version']} out of every request that starts from now on; running requests untouched"
    )
    report.first_at_info(
        _SAID,
        "caller-flush",
        ID,
        "changed",
        "[%s] %s: flush asked for while %d requests run or wait, after weight version %d (not flushed since): "
        "answered success at once, the cache kept (SGLang: failed, HTTP 400): requests that start from now on never "
        "match KV of earlier weights, running ones untouched; the 200 no longer means nothing runs (%s)",
        ID,
        WHAT,
        live,
        _STATE["version"],
        LINK,
    )
    return result
