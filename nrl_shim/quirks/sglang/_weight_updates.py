"""The scheduler's weight-update handlers, for the SGLang fixes that follow weight updates (one scheduler per process:
TP and DP ranks each see every update), and SGLang's one "weights changed" hook below them: `subscribe(owner,
quirk_id, after)` has `after(route)` called once each update handler returned or raised (a failed update may have
written some tensors), and once a weight-update session with no load in it ended (0.5.21+), in subscription order
(registry order), from one layer on each handler that every subscribed fix shares; `unsubscribe` takes the fix off,
and the layer with the last one. A fix that must change the update itself (the radix fix's flush) wraps the handlers
on top of it.

They live on SchedulerUpdateWeightsMixin (`sglang.srt.managers.scheduler_update_weights_mixin`) up to 0.5.12.post1 and
on SchedulerWeightUpdaterManager (`sglang.srt.managers.scheduler_components.weight_updater`) from 0.5.13: one of the two
exists per release, so a fix lists both as targets (`targets`) and both in its REQUIRES (`requires`).
"""

MIXIN = "sglang.srt.managers.scheduler_update_weights_mixin"  # up to 0.5.12.post1
MANAGER = "sglang.srt.managers.scheduler_components.weight_updater"  # 0.5.13+
_OWNERS = {MIXIN: "SchedulerUpdateWeightsMixin", MANAGER: "SchedulerWeightUpdaterManager"}
# Every route a trainer's weights come in by; update_weights_from_ipc is absent from some releases (wrapped where there).
UPDATES = (
    "update_weights_from_tensor",
    "update_weights_from_distributed",
    "update_weights_from_disk",
    "update_weights_from_ipc",
)


def requires(*extra, routes=UPDATES):
    """REQUIRES entries: each update handler of `routes`, and each of `extra` (method names), on both owners."""
    return tuple(
        f"{module}:{owner}.{name}(recv_req)" for module, owner in _OWNERS.items() for name in (*routes, *extra)
    )


def wrap_updates(owner, wrapper, quirk_id, routes=UPDATES):
    """Wrap each update handler of `routes` that `owner` has with `wrapper(wrapped, instance, args, kwargs)`
    (nrl_shim.patching)."""
    from nrl_shim.patching import wrap

    for name in routes:
        if hasattr(owner, name):
            wrap(owner, name, wrapper, quirk_id)


def unwrap_updates(owner, quirk_id):
    from nrl_shim.patching import unwrap

    for name in UPDATES:
        if hasattr(owner, name):
            unwrap(owner, name, quirk_id)


def targets(patch_owner, unpatch_owner):
    """TARGETS entries for both owners' modules: `patch_owner(owner class, settings)`, `unpatch_owner(owner class)`."""
    return {
        module: (
            lambda m, settings, name=name: patch_owner(getattr(m, name), settings),
            lambda m, name=name: unpatch_owner(getattr(m, name)),
        )
        for module, name in _OWNERS.items()
    }


# The one "weights changed" layer on each handler, in nrl_shim.patching: not a quirk id, the hook its subscribers share.
HOOK = "sglang-weights-changed"
_AFTER: dict = {}  # quirk id -> after(route); insertion order is subscription order
_BEFORE: dict = {}  # quirk id -> before(owner instance, route), for the subscribers that look before an update


# 0.5.21+ (read in the wheels): a weight-update session, begin_weight_update ... end_weight_update. Weights written
# in place by a transport SGLang does not see (P2P/RDMA) come with no load handler in the session; SGLang's end then
# runs the model's post-load step, and that end is the only sign the weights changed. A session with a load in it was
# counted at the load. Releases before 0.5.21 have no sessions (no such route).
SESSION_END = "end_weight_update"
_UNLOADED_SESSION = "end_weight_update with no tensor or distributed load in the session (SGLang's post-load step: weights written in place, P2P/RDMA)"


def subscribe(owner, quirk_id, after, before=None):
    """Have `after(route)` called after each update handler of `owner` (route: the handler's name) and after the end
    of a weight-update session with no load in it; `before(instance, route)`, if given, before each update handler
    (instance: the handler's owner, the scheduler or its weight-updater manager)."""
    from nrl_shim.patching import wrap

    _AFTER[quirk_id] = after
    if before is not None:
        _BEFORE[quirk_id] = before
    wrap_updates(owner, _changed_wrapper, HOOK)
    if hasattr(owner, SESSION_END):
        wrap(owner, SESSION_END, _session_end_wrapper, HOOK)


def unsubscribe(owner, quirk_id):
    from nrl_shim.patching import unwrap

    _AFTER.pop(quirk_id, None)
    _BEFORE.pop(quirk_id, None)
    if not _AFTER:
        unwrap_updates(owner, HOOK)
        if hasattr(owner, SESSION_END):
            unwrap(owner, SESSION_END, HOOK)


def _changed(route):
    for quirk_id, after in list(_AFTER.items()):
        try:
            after(route)
        except Exception as error:  # never fail an update over a fix
            from nrl_shim import report

            report.logger().debug("[%s] could not follow the weight update: %r", quirk_id, error)


def _changed_wrapper(wrapped, instance, args, kwargs):
    for quirk_id, before in list(_BEFORE.items()):
        try:
            before(instance, wrapped.__name__)
        except Exception as error:  # never fail an update over a fix
            from nrl_shim import report

            report.logger().debug("[%s] could not look before the weight update: %r", quirk_id, error)
    try:
        return wrapped(*args, **kwargs)
    finally:  # in the scheduler's loop: before it takes its next request
        _changed(wrapped.__name__)


def _session_end_wrapper(wrapped, instance, args, kwargs):
    session = getattr(instance, "_session", None)  # None: no session open, SGLang answers so and changes nothing
    unloaded = session is not None and not getattr(session, "loaded_weights", True)
    try:
        return wrapped(*args, **kwargs)
    finally:
        if unloaded:
            _changed(_UNLOADED_SESSION)
