"""The refit probe in SGLang's schedulers (docs/probe.md): after each weight update, the weights the scheduler serves
checked against its earlier versions, and (in the job report) the other replicas.

Each scheduler process (every TP rank, every DP replica) holds its model and sees every update. On SGLang's one
"weights changed" hook (_weight_updates: tensor, distributed, disk and IPC handlers, and the end of a weight-update
session with no load in it): the weights as the scheduler first serves them are version 0 (taken at its first batch);
each update handler's first call of a refit checks the weights are still the last version's; the scheduler's next
batch (`run_batch`, before it runs) ends the refit (NeMo RL's and slime's bucketed updates are many calls) and takes
the new version. A session's end with no load in it (weights written in place, P2P/RDMA) is a refit the scheduler
hears of only once it is over: nothing to check before it. One WARNING per kind of finding and process; strict mode
raises ProbeFindingError at the next batch.

It reads the weights; it never writes them, never adds a request or draws a random number. Not covered on SGLang:
"landed nowhere" (the tensors sent are deserialized or read from disk inside SGLang's loader, where the probe does not
see them: an update of unchanged files reads as a re-sync), the draft model of speculative decoding, and what vLLM's
probe module also leaves out (docs/probe.md).
"""

from nrl_shim.quirks.sglang import SGLANG_SINCE, _weight_updates

TYPE_CHECKING = False  # not typing's: quirk modules stay stdlib-light
if TYPE_CHECKING:
    from typing import Any

ID = "sglang-weights-probe"
SUMMARY = (
    "The refit probe: after each weight update, each SGLang scheduler's weights checked against its earlier versions "
    "and the other replicas (weights changed under the engine, an update that brought back an earlier version)"
)
LINK = "https://github.com/huggingface/trl/issues/5312"
LIBRARY = "sglang"
# A check, not a bug's fix: every release the SGLang fixes are declared for. Run on SGLang 0.5.10.post1, 0.5.12.post1,
# 0.5.15.post1 and 0.5.23 (tests/test_sglang_weights_probe.py); the handlers' homes per release are _weight_updates'.
VERSIONS, VERIFIED = SGLANG_SINCE, ">=0.5.10,<0.5.24"
_SCHEDULER = "sglang.srt.managers.scheduler"
REQUIRES = (f"{_SCHEDULER}:Scheduler.run_batch", *_weight_updates.requires())
# Served vs recomputed (check a): the scheduler's radix cache, the default tree of every release up to 0.5.22 and the
# unified tree (0.5.12+, the default from 0.5.23); other trees (HiCache's own match, SWA, Mamba, LMCache's, the C++
# tree) are not checked.
_RADIX, _UNIFIED = "sglang.srt.mem_cache.radix_cache", "sglang.srt.mem_cache.unified_radix_cache"
_SERVED_PART = "served vs recomputed (stale radix-cache KV after an update)"
PARTS = {_SERVED_PART: (f"{_RADIX}:RadixCache.match_prefix",)}
_SERVED_CAUSE = (
    "the radix cache kept KV of the weights before the update and a request matched it (sglang-radix-cache-refit off, "
    "an update route it does not count, or a flush the caller skipped or SGLang refused)"
)
WHAT = "SGLang weights after an update"
ENGINE = "sglang"
_STATE: "dict[str, Any]" = {"on": True, "probe": None, "probes": None, "served": None, "trees": None}


def _engine_probes():
    from nrl_shim.probe.engine import probes_for

    _STATE["probes"] = probes = probes_for(ID, WHAT)  # _STATE: the step wrappers' check costs no import
    return probes


def _runner(holder):
    """The model runner of a scheduler or its weight-updater manager (tp_worker.model_runner; an overlap worker's
    .worker first on older releases)."""
    worker = getattr(holder, "tp_worker", None)
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        runner = getattr(getattr(worker, "worker", None), "model_runner", None)
    return runner


def _ranks(runner, scheduler):
    """(tp, pp, dp) of this scheduler: the runner's and scheduler's own attributes up to 0.5.2x; on 0.5.23 they live
    in SGLang's process-wide parallel context (sglang.srt.runtime_context.get_parallel()). None where unknown."""
    found = {}
    for key in ("tp_rank", "pp_rank", "dp_rank"):
        found[key] = next((getattr(o, key) for o in (runner, scheduler) if getattr(o, key, None) is not None), None)
    if None in found.values():
        try:
            from sglang.srt.runtime_context import get_parallel

            parallel = get_parallel()
        except Exception:  # a release without the context: left unknown
            parallel = None
        for key, value in found.items():
            try:
                found[key] = getattr(parallel, key) if value is None and parallel is not None else value
            except Exception:  # a rank the context was never given in this process: left unknown
                pass
    return found["tp_rank"], found["pp_rank"], found["dp_rank"]


def _probe(holder):
    """This process's probe (one scheduler per process), made at first sight: version 0 is what it serves now."""
    if _STATE["probe"] is not None:
        return _STATE["probe"]
    import time

    from nrl_shim.probe.weights import WeightsProbe, layout_key

    runner = _runner(holder)
    model = getattr(runner, "model", None)
    if model is None or not hasattr(model, "named_parameters"):
        return None
    scheduler = getattr(holder, "scheduler", None) or holder
    tp, pp, dp = _ranks(runner, scheduler)
    where = {
        "model": type(model).__name__,
        "model_id": id(model),
        "tp_rank": tp,
        "pp_rank": pp,
        "dp_rank": dp,
        "layout": layout_key(model, (tp, pp)),
    }
    started = time.perf_counter()
    # The runner is asked for its model each time: the probe follows what the scheduler serves.
    probe = WeightsProbe(model, ENGINE, where, model_of=lambda: getattr(runner, "model", None))
    _STATE["probe"] = probe
    _follow_tree(scheduler, where)
    _engine_probes().following(probe, time.perf_counter() - started)
    return probe


def _before_update(instance, route):
    probe = _probe(instance)
    if probe is not None:
        _engine_probes().starts(probe)


def _after_update(route):
    _STATE["served_due"] = True  # the radix cache is noted at its next lookup (after the last bucket)
    probe = _STATE["probe"]
    if probe is not None and route not in _weight_updates.UPDATES:  # a session's end with no load: written in place
        _engine_probes().starts(probe, check=False)


def _batch_wrapper(wrapped, instance, args, kwargs):
    if _STATE["probe"] is None:
        try:
            _probe(instance)
        except Exception as error:  # never fail a batch over the probe
            from nrl_shim import report

            report.logger().debug("[%s] could not follow the model: %r", ID, error)
    probes = _STATE["probes"]
    if probes is not None and (probes.pending or probes.finding):
        probes.step()  # an update since the last batch ends here, before this batch is served from it
    return wrapped(*args, **kwargs)


def _patch_scheduler(module, settings):
    from nrl_shim.patching import wrap

    _STATE["on"] = settings.probe == "on"
    _engine_probes().strict = settings.strict
    if _STATE["on"]:
        wrap(module.Scheduler, "run_batch", _batch_wrapper, ID)


def _unpatch_scheduler(module):
    from nrl_shim.patching import unwrap

    unwrap(module.Scheduler, "run_batch", ID)
    _engine_probes().clear()
    _STATE.update(probe=None, served=None, trees=None, served_due=False)


def _patch_updates(owner, settings):
    if settings.probe == "on":
        _weight_updates.subscribe(owner, ID, _after_update, before=_before_update)  # SGLang's one hook


def _unpatch_updates(owner):
    _weight_updates.unsubscribe(owner, ID)


# --- served vs recomputed: the scheduler's radix cache (docs/probe.md, check a) ---


def _follow_tree(scheduler, where):
    """The scheduler's tree cache (and the trees a session wrapper holds inside it), and the probe of its KV."""
    import weakref

    from nrl_shim.probe.served import ServedProbe

    trees: weakref.WeakSet[Any] = weakref.WeakSet()
    tree = getattr(scheduler, "tree_cache", None)
    while tree is not None and tree not in trees:
        trees.add(tree)
        tree = getattr(tree, "inner", None)
    _STATE["trees"] = trees
    served_where = {
        "model": f"radix cache of {where['model']}",
        "tp_rank": where["tp_rank"],
        "dp_rank": where["dp_rank"],
    }
    _STATE["served"] = ServedProbe(ENGINE, served_where, _SERVED_CAUSE, weak=True)


def _tree_nodes(tree):
    """(id, node) of every node the tree holds now (each one KV computed before this point)."""
    root = tree.root_node
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        yield id(node), node
        stack.extend(node.children.values())


def _weights_changed():
    probe = _STATE["probe"]
    if probe is None or len(probe.versions) < 2:
        return None
    return probe.versions[-1][0] != probe.versions[-2][0]


def _matched(tree, result):
    """The nodes of a match, deepest first (NodeIds resolved on the unified tree)."""
    node = getattr(result, "last_device_node", None)
    if isinstance(node, int):
        resolve = getattr(tree, "resolve_node_handle", None) or tree.tree_core.node_by_id
        node = resolve(node)
    root = tree.root_node
    while node is not None and node is not root:
        yield node
        node = node.parent


def _match_wrapper(wrapped, instance, args, kwargs):
    served, trees = _STATE.get("served"), _STATE.get("trees")
    if served is None or trees is None or instance not in trees:
        return wrapped(*args, **kwargs)  # a waiting-queue tree, or the probe not following this scheduler
    try:
        if _STATE.get("served_due"):
            _STATE["served_due"] = False
            _engine_probes().end_refits()  # the update's weights verdict first: a re-sync leaves the KV right
            served.refit(_tree_nodes(instance), _weights_changed())
    except Exception as error:  # never fail a lookup over the probe
        from nrl_shim import report

        report.logger().debug("[%s] could not note the radix cache: %r", ID, error)
    result = wrapped(*args, **kwargs)
    if served.noted():
        try:
            entries = []
            for node in _matched(instance, result):
                stale = served.holds(id(node), node)
                if not stale and any(served.holds(id(c), c) for c in node.children.values()):
                    # Only a split puts a new node above a noted one: it holds the first part of that node's KV.
                    served.note(id(node), node)
                    stale = True
                if stale:
                    entries.append((id(node), node, len(node.key)))
            params = args[0] if args else kwargs.get("params")
            rid = getattr(getattr(params, "req", None), "rid", None)
            finding = served.served(entries, f" (request {rid})" if rid else "")
            _engine_probes().say(served, finding)
        except Exception as error:  # the lookup's result goes back as it came
            from nrl_shim import report

            report.logger().debug("[%s] could not check a radix-cache hit: %r", ID, error)
    return result


def _patch_tree(owner):
    def patch(module, settings):
        from nrl_shim.patching import wrap

        cls = getattr(module, owner, None)
        if settings.probe == "on" and cls is not None and hasattr(cls, "match_prefix"):
            wrap(cls, "match_prefix", _match_wrapper, ID)

    def unpatch(module):
        from nrl_shim.patching import unwrap

        cls = getattr(module, owner, None)
        if cls is not None:
            unwrap(cls, "match_prefix", ID)

    return patch, unpatch


TARGETS = {
    _SCHEDULER: (_patch_scheduler, _unpatch_scheduler),
    _RADIX: _patch_tree("RadixCache"),
    _UNIFIED: _patch_tree("UnifiedRadixCache"),
    **_weight_updates.targets(_patch_updates, _unpatch_updates),
}


def describe(settings, version):
    if settings.probe != "on":
        return "off (NRL_SHIM_PROBE=off)"
    return (
        "after each weight update, before the scheduler's next batch: the weights' digest against earlier versions, "
        + ("an error (strict)" if settings.strict else "one warning per kind of finding")
        + "; each replica's versions in the job report. Costs two reads of the weights per refit"
    )
