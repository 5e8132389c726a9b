"""SGLang chat rollouts sample at the trainer's settings: no sampling defaults from the checkpoint's generation_config.

`--sampling-defaults model` (ServerArgs.sampling_defaults, SGLang's default since 0.5.3.post1, sglang PR #11304):
`/v1/chat/completions` (and the Responses API built on it) fills every field a request leaves unset (temperature,
top_k, top_p, min_p, repetition_penalty) from the checkpoint's generation_config.json
(`ModelConfig.get_default_sampling_params`). Released checkpoints carry such values (Qwen2.5-VL-7B-Instruct: top_k 1):
measured, a GRPO group of 8 at temperature 1.0 came out as 1 distinct completion. Native `/generate`, `Engine.generate`
and `/v1/completions` never read them.

The fix: where the caller left `sampling_defaults` at SGLang's default, chat requests fall back to SGLang's own
(OpenAI's) defaults for the fields they leave unset, as `--sampling-defaults openai` does; a request's own values are
untouched. An explicit choice is kept: `--sampling-defaults model` on the command line (or in a `--config` file), or
`ServerArgs(sampling_defaults="model")` on releases where the shared tracker can see it (nrl_shim/quirks/sglang/
_server_args.py: up to 0.5.19; from 0.5.20 a ServerArgs built in Python is a msgspec Struct the tracker can't see
into: the fix acts and its log line says so). NRL_SHIM_SAMPLING_DEFAULTS=serving (one setting for
both engines: settings.ENGINE_VARIABLES) keeps the checkpoint's defaults.
"""

from nrl_shim.quirks.sglang import SGLANG_SINCE, SGLANG_VERIFIED
from nrl_shim.quirks.sglang import _server_args as server_args_tracker

ID = "sglang-sampling-defaults"
SUMMARY = (
    "SGLang chat rollouts sample at the trainer's settings: no sampling defaults (top_k, top_p, temperature...) from "
    "the checkpoint's generation_config.json where the caller left --sampling-defaults at SGLang's default"
)
LINK = "https://github.com/sgl-project/sglang/pull/11304"
LIBRARY = "sglang"
# The bug: 0.5.3.post1 onwards (read). The fix's names, read in every wheel 0.5.10.post1 -> 0.5.23
# (ModelConfig.get_default_sampling_params and from_server_args, prepare_server_args); run on real servers: 0.5.10.post1,
# 0.5.12.post1 and 0.5.23. Declared from 0.5.10, with sglang's other fixes (older releases not run).
VERSIONS, VERIFIED = SGLANG_SINCE, SGLANG_VERIFIED
_MODEL_CONFIG = "sglang.srt.configs.model_config"
REQUIRES = (
    f"{_MODEL_CONFIG}:ModelConfig.get_default_sampling_params",
    f"{_MODEL_CONFIG}:ModelConfig.from_server_args(server_args)",
    f"{server_args_tracker.SERVER_ARGS}:prepare_server_args(argv)",
)
_CHOSEN = "_nrl_shim_sampling_defaults_chosen"  # on a ModelConfig: True, False, or None (unknown)
WHAT = "SGLang chat completions' defaults for the sampling fields a request leaves unset"


def patch_model_config(module, settings):
    from nrl_shim.patching import wrap

    def defaults_wrapper(wrapped, instance, args, kwargs):
        return _defaults(wrapped(*args, **kwargs), instance, settings)

    wrap(module.ModelConfig, "from_server_args", _from_server_args_wrapper, ID)
    wrap(module.ModelConfig, "get_default_sampling_params", defaults_wrapper, ID)


def unpatch_model_config(module):
    from nrl_shim.patching import unwrap

    unwrap(module.ModelConfig, "from_server_args", ID)
    unwrap(module.ModelConfig, "get_default_sampling_params", ID)


TARGETS = server_args_tracker.targets(ID, {_MODEL_CONFIG: (patch_model_config, unpatch_model_config)})


def describe(settings, version):
    if settings.sampling_defaults != "rl":
        return "NRL_SHIM_SAMPLING_DEFAULTS=serving: the checkpoint's sampling defaults kept for chat requests"
    return (
        "chat requests' unset sampling fields: SGLang's own defaults, not the checkpoint's generation_config "
        "(where --sampling-defaults was left at its default)"
    )


def _from_server_args_wrapper(wrapped, instance, args, kwargs):
    model_config = wrapped(*args, **kwargs)
    server_args = args[0] if args else kwargs.get("server_args")
    chosen = server_args_tracker.explicit(server_args)
    try:
        vars(model_config)[_CHOSEN] = None if chosen is None else "sampling_defaults" in chosen
    except TypeError:
        pass
    return model_config


def _defaults(checkpoint, model_config, settings):
    from nrl_shim import report

    if not checkpoint or getattr(model_config, "sampling_defaults", None) != "model":
        return checkpoint
    if settings.sampling_defaults != "rl":
        report.unchanged(ID, WHAT, "NRL_SHIM_SAMPLING_DEFAULTS=serving: the checkpoint's kept")
        return checkpoint
    try:
        chosen = vars(model_config).get(_CHOSEN)
    except TypeError:
        chosen = None
    if chosen:
        report.unchanged(ID, WHAT, "--sampling-defaults model chosen by the caller: the checkpoint's kept")
        return checkpoint
    why = "RL rollouts sample at the request's/trainer's settings; a request's own values are kept"
    if chosen is None:
        why += (
            "; a ServerArgs built in Python on SGLang 0.5.20+ can't say whether sampling_defaults='model' was chosen: "
            "NRL_SHIM_SAMPLING_DEFAULTS=serving keeps the checkpoint's"
        )
    report.changed(ID, WHAT, checkpoint, {}, f"{why}; {LINK}")
    return {}
