"""Refits of quantized layers before SGLang 0.5.21: an update from tensors that leaves them unprocessed is named.

A quantized SGLang model (FP8 from `--quantization fp8` or an FP8 checkpoint, and the other online-quantized schemes)
is post-processed once its weights are loaded: each quantized layer's `quant_method.process_weights_after_loading`
quantizes, transposes or repacks the weight and derives its scales. Up to 0.5.20 a weight update re-runs that step on
the disk route only (`load_weights_and_postprocess`); `update_weights_from_tensor` and `update_weights_from_distributed`
(the routes NeMo RL, slime and verl refit by) call the model's `load_weights` and stop: the new values are cast into
the processed parameters (a layer whose processing replaced the parameter loses its loader: the update then fails) and
the scales stay the old weights'. The update answers success; rollouts come from neither policy. 0.5.21 (sglang#28001)
runs the processing at `end_weight_update()`. Measured on 0.5.12.post1 and 0.5.10.post1 (CPU, tiny Llama,
`quantization="fp8"`, bfloat16): `update_weights_from_tensor` of one layer returned `(True, "Success")`; the layer
then held the new values cast to FP8 with the old `weight_scale`.

The shim cannot re-process the layers (their processed form is not reloadable: the release's own fix needs its
restore step), so it names the update (the vLLM refit guard's counterpart): in each scheduler process, after a
successful tensor or distributed update into a model with quantized layers (the model config's `quantization` set;
not with `--load-format flash_rl`, whose loader re-quantizes on each update), one WARNING names the quantization, how
many layers and the ways out; in strict mode the update answers success=False with that message instead (its tensors
are written already; the message says so).
"""

from nrl_shim.quirks.sglang import SGLANG_SINCE, _weight_updates

TYPE_CHECKING = False  # not typing's: quirk modules stay stdlib-light
if TYPE_CHECKING:
    from typing import Any

ID = "sglang-quantized-refit-guard"
SUMMARY = (
    "SGLang < 0.5.21: a tensor or distributed update into quantized layers, which it does not re-process, is named"
)
LINK = "https://github.com/sgl-project/sglang/pull/28001"
LIBRARY = "sglang"
# Where the bug exists, read in the wheels: 0.5.10.post1 -> 0.5.20 post-process on the disk route only; 0.5.21 adds the
# weight-update session whose end post-processes. Run on 0.5.10.post1, 0.5.12.post1 and 0.5.15.post1 (slime's pin; the
# handlers on SchedulerWeightUpdaterManager from 0.5.13) (CPU, FP8); the names it uses found in every wheel 0.5.10 ->
# 0.5.20 (tools/requires_in_wheel.py).
VERSIONS = f"{SGLANG_SINCE},<0.5.21"
VERIFIED = ">=0.5.10,<0.5.16"
FIXED_BY = LINK  # 0.5.21: end_weight_update() runs the layers' processing
_ROUTES = ("update_weights_from_tensor", "update_weights_from_distributed")
REQUIRES = _weight_updates.requires(routes=_ROUTES)
WHAT = "SGLang update of quantized layers"
_STRICT = [False]


def _patch_updates(owner, settings):
    _STRICT[0] = settings.strict
    _weight_updates.wrap_updates(owner, _update_wrapper, ID, routes=_ROUTES)


def _unpatch_updates(owner):
    _weight_updates.unwrap_updates(owner, ID)


TARGETS = _weight_updates.targets(_patch_updates, _unpatch_updates)


def describe(settings, version):
    return "a tensor or distributed weight update into quantized layers (not re-processed before 0.5.21): " + (
        "the update fails with an error (strict)" if settings.strict else "a warning"
    )


def quantized_layers(model_runner: "Any") -> "tuple[str | None, list[str]]":
    """The model's quantization (None: not quantized) and the names of its layers whose quant_method processes weights
    after loading (every linear layer has a quant_method: the Unquantized* ones of a plain model are not counted)."""
    quantization = getattr(getattr(model_runner, "model_config", None), "quantization", None)
    if not quantization:
        return None, []
    layers = [
        name
        for name, module in model_runner.model.named_modules()
        if getattr(module, "quant_method", None) is not None
        and not type(module.quant_method).__name__.startswith("Unquantized")
    ]
    return str(quantization), layers


def _model_runner(instance):
    """The target model's runner: on the scheduler (up to 0.5.12.post1) or the updater manager (0.5.13+)."""
    worker = getattr(instance, "tp_worker", None) or getattr(getattr(instance, "scheduler", None), "tp_worker", None)
    return getattr(worker, "model_runner", None)


def _update_wrapper(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    try:
        if not getattr(result, "success", False):
            return result
        runner = _model_runner(instance)
        quantization, layers = quantized_layers(runner)
        load_format = str(getattr(getattr(runner, "server_args", None), "load_format", ""))
    except Exception as error:  # never fail an update over the guard
        from nrl_shim import report

        report.logger().debug("[%s] update not checked: %r", ID, error)
        return result
    if not layers:
        return result
    from nrl_shim import report

    if load_format.endswith("flash_rl"):  # SGLang's RL loader re-quantizes on each load: nothing for the guard
        report.unchanged(ID, WHAT, "--load-format flash_rl re-quantizes the layers on each update")
        return result

    message = (
        f"[{ID}] {WHAT}: {wrapped.__name__} wrote into a model quantized with {quantization}; SGLang < 0.5.21 does not "
        f"re-run the post-processing of its {len(layers)} quantized layers after this route (e.g. "
        f"{', '.join(layers[:3])}): where that processing quantizes, repacks or derives scales (online FP8: measured, "
        "the new values cast under the old weights' scale), the layers serve weights it did not prepare and rollouts "
        "come from neither policy. Ways out: SGLang >= 0.5.21 (begin_weight_update/end_weight_update re-process them), --load-format "
        "flash_rl (re-quantizes on each load), or update_weights_from_disk (re-processes; fails for online FP8 on "
        f"these releases: sglang#7421). See {LINK}"
    )
    if _STRICT[0]:
        report.record(ID, "error", "%s", message)
        strict = f"{message} (the tensors are written; NRL_SHIM_STRICT=1; NRL_SHIM_DISABLE={ID} turns the guard off)"
        try:
            result.success, result.message = False, strict
        except AttributeError:  # a frozen output type: a copy of it
            import copy

            result = copy.copy(result)
            object.__setattr__(result, "success", False)
            object.__setattr__(result, "message", strict)
        return result
    report.warn_once(ID, wrapped.__name__, message)  # once per route and process: every later update is alike
    return result
