"""NeMo RL's V1 rules: NRL_VLLM_USE_V1 decides VLLM_USE_V1, and asking for V0 where vLLM has none fails clearly.

* Releases with the VLLM_USE_V1 variable (<= 0.11.0): as soon as `vllm.envs` is imported (before any vLLM module
  reads the variable, some do at import time on 0.8.x) VLLM_USE_V1 is set from NRL_VLLM_USE_V1; a different
  user value loses, as in NeMo RL, and the log says so. Later releases have no variable: it is left alone.
* NRL_VLLM_USE_V1=0 with vLLM >= 0.11.0 (V0 removed) -> UnsupportedConfigError at engine-config creation.
* NRL_VLLM_USE_V1=0 with the async engine (AsyncLLM, and AsyncLLMEngine from 0.11.0, its alias) ->
  UnsupportedConfigError before vLLM's own "This should not happen" ValueError.
"""

import os

from ..settings import Variable, parse_bool
from . import VLLM

ID = "vllm-v1-runtime"
SUMMARY = "NRL_VLLM_USE_V1 sets VLLM_USE_V1 (vLLM <= 0.11.0); V0 where vLLM has none fails with a clear error"
LINK = "https://github.com/NVIDIA-NeMo/RL/blob/main/docs/model-quirks.md#vllm-v1-runtime"
LIBRARY = "vllm"
VERSIONS = VLLM
EXPLAIN_ENV = ("VLLM_USE_V1",)  # environment variables this fix sets (for `nrl-shim explain`)
SETTINGS = (
    Variable(
        "NRL_VLLM_USE_V1",
        "vllm_use_v1",
        parse_bool,
        True,
        "`1` / `0`",
        "vLLM engine: V1, or V0 where it still exists (vLLM < 0.11.0; never with the async engine)",
    ),
)

V0_REMOVED_IN = "0.11.0"
VARIABLE_REMOVED_IN = "0.11.1"
_ASYNC_FACTORIES = ("from_engine_args", "from_vllm_config")


def apply_variable(use_v1, environ=None):
    """Set VLLM_USE_V1 from NRL_VLLM_USE_V1 on releases that read it; log what changed."""
    from ._vllm import version_at_least

    environ = os.environ if environ is None else environ
    if use_v1 is None or version_at_least(VARIABLE_REMOVED_IN):
        return
    if not use_v1 and version_at_least(V0_REMOVED_IN):
        return  # 0.11.0: V0 is gone; VLLM_USE_V1=0 would only trade our clear error for vLLM's unclear one
    value = "1" if use_v1 else "0"
    before = environ.get("VLLM_USE_V1")
    if before == value:
        return
    environ["VLLM_USE_V1"] = value
    from .. import report

    if before is None:
        why = "NeMo RL sets VLLM_USE_V1 from NRL_VLLM_USE_V1 (default 1) before creating engines"
    else:
        why = f"NRL_VLLM_USE_V1={value} wins over the VLLM_USE_V1={before} you set, as in NeMo RL"
    report.changed(ID, "environment VLLM_USE_V1", before, value, why)


def check_v0_available(use_v1, is_async=False):
    """Raise UnsupportedConfigError when V0 is asked for where it cannot run."""
    if use_v1 is None or use_v1:
        return
    from ..errors import UnsupportedConfigError
    from ._vllm import installed_version, version_at_least

    if is_async:
        raise UnsupportedConfigError(
            "NRL_VLLM_USE_V1=0 asks for vLLM's V0 engine, but the async engine (vllm.v1.engine.async_llm.AsyncLLM) "
            "always runs V1. Switch to synchronous inference (policy.generation.vllm_cfg.async_engine=False) "
            "or drop NRL_VLLM_USE_V1=0."
        )
    if version_at_least(V0_REMOVED_IN):
        raise UnsupportedConfigError(
            f"NRL_VLLM_USE_V1=0 asks for vLLM's V0 engine, but the installed vLLM {installed_version()} has none "
            f"(V0 was removed in vLLM {V0_REMOVED_IN}). Unset NRL_VLLM_USE_V1 (or set it to 1), "
            f"or install vLLM < {V0_REMOVED_IN}."
        )


def patch_envs(module, settings):
    apply_variable(settings.vllm_use_v1)


def patch_arg_utils(module, settings):
    from ..patching import wrap

    use_v1 = settings.vllm_use_v1

    def create_engine_config_wrapper(wrapped, instance, args, kwargs):
        check_v0_available(use_v1)
        apply_variable(use_v1)  # again: a user may have changed os.environ after vLLM was imported
        return wrapped(*args, **kwargs)

    wrap(module.EngineArgs, "create_engine_config", create_engine_config_wrapper, ID)


def unpatch_arg_utils(module):
    from ..patching import unwrap

    unwrap(module.EngineArgs, "create_engine_config", ID)


def patch_async_llm(module, settings):
    from ..patching import wrap

    use_v1 = settings.vllm_use_v1

    def async_engine_wrapper(wrapped, instance, args, kwargs):
        check_v0_available(use_v1, is_async=True)
        return wrapped(*args, **kwargs)

    for name in ("__init__",) + _ASYNC_FACTORIES:
        wrap(module.AsyncLLM, name, async_engine_wrapper, ID)


def unpatch_async_llm(module):
    from ..patching import unwrap

    for name in ("__init__",) + _ASYNC_FACTORIES:
        unwrap(module.AsyncLLM, name, ID)


def _keep_variable(module):
    pass  # VLLM_USE_V1 stays: vLLM may already have read it, and child processes must see the same engine choice


TARGETS = {
    "vllm.envs": (patch_envs, _keep_variable),  # as soon as vLLM reads its environment
    "vllm.engine.arg_utils": (patch_arg_utils, unpatch_arg_utils),
    "vllm.v1.engine.async_llm": (patch_async_llm, unpatch_async_llm),
}


def describe(settings, version):
    from packaging.version import Version

    if version is None:
        return "vLLM not installed"
    v = Version(version)
    wanted = "1" if settings.vllm_use_v1 else "0"
    if v >= Version(VARIABLE_REMOVED_IN):
        rule = "V1 only, no VLLM_USE_V1 variable"
    elif v >= Version(V0_REMOVED_IN):
        rule = "V1 only (VLLM_USE_V1=0 is an error)"
    else:
        rule = f"sets VLLM_USE_V1={wanted}"
    if wanted == "0" and v >= Version(V0_REMOVED_IN):
        rule += "; NRL_VLLM_USE_V1=0 will fail at engine creation"
    elif wanted == "0":
        rule += "; the async engine (AsyncLLM) will refuse V0"
    return f"NRL_VLLM_USE_V1={wanted}; vLLM {version}: {rule}"
