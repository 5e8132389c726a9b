"""NeMo RL's V1 rules: NRL_VLLM_USE_V1 decides VLLM_USE_V1, and asking for V0 where vLLM has none fails clearly.

* NRL_VLLM_USE_V1 unset (the default): VLLM_USE_V1 is left alone. vLLM's own default is already V1, and on releases
  that still have V0 (<= 0.10) vLLM falls back to V0 by itself for a configuration its V1 engine can't run (vLLM
  0.9.1 on CPU: float32, sliding-window attention). NeMo RL (since its #482) sets VLLM_USE_V1=1 unconditionally, which
  turns that fallback into vLLM's NotImplementedError; the shim doesn't, because it never turns a configuration
  that runs into an error the user didn't ask for. When vLLM does fall back, one warning says so and names the
  variable that would insist.
* NRL_VLLM_USE_V1 set, on releases with the VLLM_USE_V1 variable (<= 0.11.0): as soon as `vllm.envs` is imported
  (before any vLLM module reads the variable, some do at import time on 0.8.x) VLLM_USE_V1 is set from it; a
  different user value loses, as in NeMo RL, and the log says so. If vLLM then refuses V1 for this configuration,
  the error says it is NRL_VLLM_USE_V1=1 that insists. Later releases have no variable: it is left alone.
* NRL_VLLM_USE_V1=0 with vLLM >= 0.11.0 (V0 removed) -> UnsupportedConfigError at engine-config creation.
* NRL_VLLM_USE_V1=0 with the async engine (AsyncLLM, and AsyncLLMEngine from 0.11.0, its alias) ->
  UnsupportedConfigError before vLLM's own "This should not happen" ValueError.
"""

import os

from nrl_shim.quirks.vllm import VLLM_SINCE, VLLM_VERIFIED
from nrl_shim.settings import Variable, parse_bool

ID = "vllm-v1-runtime"
SUMMARY = "NRL_VLLM_USE_V1 sets VLLM_USE_V1 (vLLM <= 0.11.0); V0 where vLLM has none fails with a clear error"
LINK = "https://github.com/NVIDIA-NeMo/RL/blob/main/docs/model-quirks.md#vllm-v1-runtime"
LIBRARY = "vllm"
VERSIONS, VERIFIED = VLLM_SINCE, VLLM_VERIFIED
REQUIRES = (
    "vllm.engine.arg_utils:EngineArgs.create_engine_config",
    "vllm.v1.engine.async_llm:AsyncLLM.__init__",
)
EXPLAIN_ENV = ("VLLM_USE_V1",)  # environment variables this fix sets (for `nrl-shim explain`)
SETTINGS = (
    Variable(
        "NRL_VLLM_USE_V1",
        "vllm_use_v1",
        parse_bool,
        None,
        "`1` / `0`",
        "vLLM engine: `1` insists on V1, `0` selects V0 where it still exists (vLLM < 0.11.0; never with the async "
        "engine); unset: vLLM's default (V1, falling back to V0 by itself where its V1 can't run the configuration)",
    ),
)

V0_REMOVED_IN = "0.11.0"
VARIABLE_REMOVED_IN = "0.11.1"
_ASYNC_FACTORIES = ("from_engine_args", "from_vllm_config")


def apply_variable(use_v1, environ=None):
    """Set VLLM_USE_V1 from NRL_VLLM_USE_V1 on releases that read it; log what changed."""
    from nrl_shim.quirks.vllm._common import version_at_least

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
    from nrl_shim import report

    if before is None:
        why = f"NRL_VLLM_USE_V1={value} is set; NeMo RL (since its #482) sets VLLM_USE_V1 from it the same way"
    else:
        why = f"NRL_VLLM_USE_V1={value} wins over the VLLM_USE_V1={before} you set, as in NeMo RL"
    report.changed(ID, "environment VLLM_USE_V1", before, value, why)


def check_v0_available(use_v1, is_async=False):
    """Raise UnsupportedConfigError when V0 is asked for where it cannot run."""
    if use_v1 is None or use_v1:
        return
    from nrl_shim.errors import UnsupportedConfigError
    from nrl_shim.quirks.vllm._common import installed_version, version_at_least

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


_V1_REFUSED = "VLLM_USE_V1=1 is not supported with"  # vLLM <= 0.10's _raise_or_fallback, when V1 is insisted on


def insisted_error(use_v1, error):
    """vLLM's NotImplementedError for a V1 request, re-worded when it was NRL_VLLM_USE_V1=1 that insisted; else None."""
    from nrl_shim.errors import UnsupportedConfigError
    from nrl_shim.quirks.vllm._common import installed_version

    if use_v1 is not True or _V1_REFUSED not in str(error):
        return None
    return UnsupportedConfigError(
        f"NRL_VLLM_USE_V1=1 is set, so the shim set VLLM_USE_V1=1, and vLLM {installed_version()}'s V1 engine does "
        f"not run this configuration (vLLM: {error}). Unset NRL_VLLM_USE_V1 to let vLLM fall back to its V0 engine "
        "by itself, or set NRL_VLLM_USE_V1=0."
    )


def warn_fallback(use_v1, before, environ=None):
    """After vLLM built an engine config: warn once when vLLM chose V0 by itself (nothing asked for an engine).
    `before` is VLLM_USE_V1 as it was before the build: vLLM <= 0.10 records its own choice there (0 = fell back)."""
    environ = os.environ if environ is None else environ
    if use_v1 is not None or before is not None or environ.get("VLLM_USE_V1") != "0":
        return
    from nrl_shim import report
    from nrl_shim.quirks.vllm._common import installed_version

    report.warn_once(
        ID,
        "fallback",
        f"[{ID}] vLLM {installed_version()} runs this engine on V0: its V1 engine does not support the configuration "
        "(vLLM's own log names the feature), and nothing asked for V1, so the shim leaves vLLM's own fallback "
        "alone. NeMo RL (since its #482) sets VLLM_USE_V1=1 and would stop here with NotImplementedError. "
        "Set NRL_VLLM_USE_V1=1 to insist on V1 (an error for this configuration), or NRL_VLLM_USE_V1=0 to choose V0.",
    )


def patch_envs(module, settings):
    apply_variable(settings.vllm_use_v1)


def patch_arg_utils(module, settings):
    from nrl_shim.patching import wrap

    use_v1 = settings.vllm_use_v1

    def create_engine_config_wrapper(wrapped, instance, args, kwargs):
        check_v0_available(use_v1)
        apply_variable(use_v1)  # again: a user may have changed os.environ after vLLM was imported
        before = os.environ.get("VLLM_USE_V1")
        try:
            config = wrapped(*args, **kwargs)
        except NotImplementedError as error:
            clearer = insisted_error(use_v1, error)
            if clearer is None:
                raise
            raise clearer from error
        warn_fallback(use_v1, before)
        return config

    wrap(module.EngineArgs, "create_engine_config", create_engine_config_wrapper, ID)


def unpatch_arg_utils(module):
    from nrl_shim.patching import unwrap

    unwrap(module.EngineArgs, "create_engine_config", ID)


def patch_async_llm(module, settings):
    from nrl_shim.patching import wrap

    use_v1 = settings.vllm_use_v1

    def async_engine_wrapper(wrapped, instance, args, kwargs):
        check_v0_available(use_v1, is_async=True)
        return wrapped(*args, **kwargs)

    for name in ("__init__",) + _ASYNC_FACTORIES:
        wrap(module.AsyncLLM, name, async_engine_wrapper, ID)


def unpatch_async_llm(module):
    from nrl_shim.patching import unwrap

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
    if settings.vllm_use_v1 is None:
        if v >= Version(V0_REMOVED_IN):
            return f"NRL_VLLM_USE_V1 unset; vLLM {version}: V1 only"
        return f"NRL_VLLM_USE_V1 unset; vLLM {version}: its default (V1, falling back to V0 by itself), not changed"
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
