"""Model types NeMo RL loads with real weights besides Gemma, and the user's own: vLLM load_format "dummy" -> "auto".

NeMo RL (HEAD, 2026-08) starts vLLM with load_format="auto" for every model its ModelFlag.VLLM_LOAD_FORMAT_AUTO
matches: Gemma (is_gemma_model: the `vllm-gemma-load-format` quirk, with its reason and its fixed release) and the
Nemotron-H Nano VL types (is_nano_nemotron_vl_model), for which it gives no reason. A user moving from NeMo RL to a
framework that starts vLLM with dummy weights (verl does by default) keeps NeMo RL's behaviour for those types here.
NRL_SHIM_AUTO_LOAD_MODEL_TYPES adds types of the user's own (a model whose refit misses a buffer, say: see the
refit guard). No vLLM release is known to make these unnecessary, so the fix applies on every supported release.
Applied in EngineArgs.create_engine_config(), as the Gemma fix.
"""

from nrl_shim.quirks.vllm import VLLM_SINCE, VLLM_VERIFIED
from nrl_shim.quirks.vllm._common import engine_config_handlers
from nrl_shim.settings import Variable, parse_words

ID = "vllm-auto-load-format"
SUMMARY = (
    "model types NeMo RL loads with real weights besides Gemma (Nemotron-H Nano VL) and your own: "
    "vLLM load_format 'dummy' -> 'auto'"
)
LINK = (
    "https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/"
    "nemo_rl/models/huggingface/common.py#L50-L74"
)
LIBRARY = "vllm"
VERSIONS, VERIFIED = VLLM_SINCE, VLLM_VERIFIED
REQUIRES = (
    "vllm.engine.arg_utils:EngineArgs.create_engine_config",
    "vllm.engine.arg_utils:EngineArgs.load_format",
)
ARG_UTILS = "vllm.engine.arg_utils"
EXPLAIN_FIELDS = ("load_config.load_format",)
SETTINGS = (
    Variable(
        "NRL_SHIM_AUTO_LOAD_MODEL_TYPES",
        "auto_load_model_types",
        parse_words,
        (),
        "comma list of HF `model_type` values, e.g. `my_model,other_model`",
        "more model types whose vLLM load_format 'dummy' becomes 'auto' (beside NeMo RL's Nemotron-H Nano VL types; "
        "Gemma has its own fix)",
    ),
)

# NeMo RL HEAD's is_nano_nemotron_vl_model (nemo_rl/models/huggingface/common.py): model_type values, exactly.
NEMO_RL_MODEL_TYPES = frozenset({"NemotronH_Nano_VL_V2", "NemotronH_Nano_Omni_Reasoning_V3"})
_NEMO_RL_WHY = (
    f"NeMo RL loads real weights for this model type (ModelFlag.VLLM_LOAD_FORMAT_AUTO); it gives no reason; {LINK}"
)
_USER_WHY = "listed in NRL_SHIM_AUTO_LOAD_MODEL_TYPES"


def reason(model_type, settings):
    """Why `model_type` loads real weights, or None when it is not one of this quirk's types."""
    if model_type in NEMO_RL_MODEL_TYPES:
        return _NEMO_RL_WHY
    if settings is not None and model_type in settings.auto_load_model_types:
        return _USER_WHY
    return None


def fix_engine_args(engine_args, settings):
    """Turn dummy into auto on `engine_args` (in place) for the model types above."""
    from nrl_shim.quirks.vllm._common import (
        auto_load_format_like,
        is_dummy_load_format,
        load_format_text,
        model_type_of,
    )

    load_format = getattr(engine_args, "load_format", None)
    if settings is None or not is_dummy_load_format(load_format):
        return
    model, model_type = model_type_of(engine_args)
    why = reason(model_type, settings)
    if why is None:
        return
    engine_args.load_format = auto_load_format_like(load_format)
    from nrl_shim import report

    report.changed(ID, f"vllm load_format for {model_type} model {model!r}", load_format_text(load_format), "auto", why)


# fix_engine_args before every EngineArgs.create_engine_config() (vllm/_common.py)
TARGETS = {ARG_UTILS: engine_config_handlers(ID, fix_engine_args)}


def describe(settings, version):
    extra = sorted(settings.auto_load_model_types)
    types = sorted(NEMO_RL_MODEL_TYPES) + extra
    return "dummy -> auto for model types " + ", ".join(types) + (" (yours: " + ", ".join(extra) + ")" if extra else "")
