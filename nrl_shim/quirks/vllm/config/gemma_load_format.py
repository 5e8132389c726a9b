"""Gemma-2/3 with load_format="dummy" generate garbage after a weight refit on vLLM < 0.9.2.

vLLM registered Gemma's `normalizer` (sqrt(hidden_size)) as a persistent buffer; dummy init randomises it and a refit
never sends it. vLLM PR #19788 made it non-persistent (in 0.9.2). NeMo RL forces load_format="auto" for Gemma on
every release; so do we by default. Applied in EngineArgs.create_engine_config(), which every engine entry path
(LLM, LLMEngine/AsyncLLM/AsyncLLMEngine.from_engine_args, the OpenAI server) goes through on 0.8.5 - 0.33.
"""

from nrl_shim.quirks.vllm import VLLM_SINCE, VLLM_VERIFIED
from nrl_shim.quirks.vllm._common import engine_config_handlers
from nrl_shim.settings import Variable, choice

ID = "vllm-gemma-load-format"
SUMMARY = "Gemma-2/3 models: vLLM load_format 'dummy' -> 'auto' (dummy init corrupts the normalizer buffer)"
LINK = "https://github.com/vllm-project/vllm/pull/19788"
LIBRARY = "vllm"
VERSIONS, VERIFIED = VLLM_SINCE, VLLM_VERIFIED
REQUIRES = (
    "vllm.engine.arg_utils:EngineArgs.create_engine_config",
    "vllm.engine.arg_utils:EngineArgs.load_format",
)
ARG_UTILS = "vllm.engine.arg_utils"
MODES = ("always", "affected", "off")
EXPLAIN_FIELDS = ("load_config.load_format",)  # engine-config fields this fix sets (for `nrl-shim explain`)
SETTINGS = (
    Variable(
        "NRL_SHIM_GEMMA_LOAD_FORMAT",
        "gemma_load_format",
        choice(*MODES),
        "always",
        "`always` / `affected` / `off`",
        "`always`: as NeMo RL; `affected`: only on vLLM < 0.9.2, where the bug exists (dummy init stays on fixed "
        "releases and start-up skips a full weight load); `off`: never",
    ),
)

GEMMA_MODEL_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text"})  # NeMo RL's is_gemma_model (not gemma, gemma3n)
FIXED_IN = "0.9.2"  # first vLLM release with vLLM PR #19788 (persistent=False)
_WHY = f"Gemma's normalizer buffer is randomised by dummy init and never refit on vLLM < {FIXED_IN}; see {LINK}"

_affected_cache: dict = {}


def vllm_is_affected(version):
    """True when this vLLM version still has the persistent normalizer buffer."""
    if version not in _affected_cache:
        from packaging.version import Version

        _affected_cache[version] = Version(version) < Version(FIXED_IN)
    return _affected_cache[version]


def mode_applies(mode, version):
    """Whether NRL_SHIM_GEMMA_LOAD_FORMAT=mode changes Gemma's dummy load format on this vLLM version."""
    return mode == "always" or (mode == "affected" and vllm_is_affected(version))


def fix_engine_args(engine_args, settings):
    """Turn dummy into auto on `engine_args` (in place) when it is a Gemma model and the mode says so."""
    from nrl_shim.quirks.vllm._common import (
        auto_load_format_like,
        installed_version,
        is_dummy_load_format,
        load_format_text,
        model_type_of,
    )

    load_format = getattr(engine_args, "load_format", None)
    if (
        settings is None
        or not is_dummy_load_format(load_format)
        or not mode_applies(settings.gemma_load_format, installed_version())
    ):
        return
    model, model_type = model_type_of(engine_args)
    if model_type is None:
        from nrl_shim import report

        report.logger().debug("[%s] no readable HF config for model %r; load_format left as %r", ID, model, load_format)
        return
    if model_type not in GEMMA_MODEL_TYPES:
        return
    engine_args.load_format = auto_load_format_like(load_format)
    from nrl_shim import report

    report.changed(
        ID, f"vllm load_format for {model_type} model {model!r}", load_format_text(load_format), "auto", _WHY
    )


# fix_engine_args before every EngineArgs.create_engine_config() (vllm/_common.py)
TARGETS = {ARG_UTILS: engine_config_handlers(ID, fix_engine_args)}


def idle(settings, version):
    """Why the fix has nothing to do here (for `nrl-shim doctor`), or None."""
    if version is not None and not mode_applies(settings.gemma_load_format, version):
        return f"NRL_SHIM_GEMMA_LOAD_FORMAT={settings.gemma_load_format} and vLLM {version} is " + (
            "affected" if vllm_is_affected(version) else f"fixed upstream (>= {FIXED_IN})"
        )
    return None


def describe(settings, version):
    mode = settings.gemma_load_format
    if version is None:
        return f"NRL_SHIM_GEMMA_LOAD_FORMAT={mode}; vLLM not installed"
    affected = vllm_is_affected(version)
    state = "affected (persistent normalizer buffer)" if affected else f"fixed upstream (>= {FIXED_IN})"
    effect = "Gemma dummy -> auto" if mode_applies(mode, version) else "Gemma dummy load format kept"
    return f"NRL_SHIM_GEMMA_LOAD_FORMAT={mode}; vLLM {version} is {state}: {effect}"
