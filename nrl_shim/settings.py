"""Settings: every NRL_* variable declared once (the core's here, each quirk's own in its module as SETTINGS), parsed
and validated once into one immutable Settings. A bad value is one SettingsError naming the variable, the value and
what is accepted. The registry collects the declarations (registry.variables(), registry.load_settings()).

Stdlib only, no dataclasses/typing/logging/math: this runs at start-up of every interpreter when NRL_SHIM=1. Quirks
declare their variables with the parsers below (and nowhere else): nrl_shim/_quirk_index.py repeats the declarations,
so settings are validated at activation without importing any quirk module.
"""

import os

TYPE_CHECKING = False  # not typing's: this module is on every interpreter's start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any, NoReturn

_TRUE = ("1", "true", "yes", "on")
# Old quirk ids that name several fixes now (a fix split in parts, each with its own id): NRL_SHIM_DISABLE accepts the
# old id as the name of all of them, so a job's settings keep working. {old id: (the ids it names, ...)}.
ALIASES = {
    "vllm-rollout-sampling": ("vllm-sampling-defaults", "vllm-trainer-logprobs", "vllm-strict-tool-calling"),
}
_FALSE = ("0", "false", "no", "off")
_LEVELS = {"CRITICAL": 50, "ERROR": 40, "WARNING": 30, "WARN": 30, "INFO": 20, "DEBUG": 10}


def _fail(name: str, raw: str, accepted: str) -> "NoReturn":
    from .errors import SettingsError  # here: the errors module is not worth loading at every start-up

    raise SettingsError(f"{name}={raw!r} is not valid; accepted: {accepted}")


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    _fail(name, raw, "1 or 0 (also true/false, yes/no, on/off)")


def parse_level(name: str, raw: str) -> int:
    value = raw.strip()
    if value.upper() in _LEVELS:
        return _LEVELS[value.upper()]
    _fail(name, raw, "a logging level name: DEBUG, INFO, WARNING, ERROR or CRITICAL")


def parse_seconds(name: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):  # false for nan too (no `math`: it is a shared library to load at start-up)
        _fail(name, raw, "a positive, finite number of seconds, e.g. 600 or 1.5")
    return value


def parse_word(name: str, raw: str) -> str:
    # A recipe name or a glob: one token, printable, no separators that would make it ambiguous in a list.
    value = raw.strip()
    if not value or not value.isprintable() or any(c.isspace() or c == "," for c in value):
        _fail(name, raw, "one non-empty name without spaces, commas or control characters")
    return value


def parse_words(name: str, raw: str) -> tuple:
    return tuple(parse_word(name, item) for item in raw.split(",") if item.strip())


def parse_directory(name: str, raw: str) -> str:
    # Every process of a job reads it, each from its own working directory: only an absolute path means one place.
    value = raw.strip()
    if value.lower() == "off":
        return "off"
    if not os.path.isabs(value) or not value.isprintable():
        _fail(name, raw, "an absolute directory path, or off")
    return value


class choice:  # lower case: used like the parse_* functions (`choice("always", "off")` is the parser)
    """Parser for one of `choices` (case-insensitive). A class rather than a closure: equal declarations compare equal
    and it has a repr that is its own source, so the quirk index can be generated from it and checked against it."""

    __slots__ = ("choices",)

    def __init__(self, *choices: str) -> None:
        self.choices = choices

    def __call__(self, name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in self.choices:
            _fail(name, raw, " | ".join(self.choices))
        return value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, choice) and other.choices == self.choices

    def __hash__(self) -> int:
        return hash(self.choices)

    def __repr__(self) -> str:
        return f"choice({', '.join(map(repr, self.choices))})"


class Variable(tuple):
    """One NRL_* variable: (name, attribute on Settings, parser, default, accepted values, meaning). A tuple (not a
    NamedTuple or dataclass): this module is on every interpreter's start-up path."""

    __slots__ = ()

    def __new__(
        cls,
        name: str,
        attr: str,
        parse: "Callable[[str, str], Any] | None",
        default: "Any",
        accepted: str,
        meaning: str,
    ) -> "Variable":
        return tuple.__new__(cls, (name, attr, parse, default, accepted, meaning))

    name = property(lambda self: self[0])
    attr = property(lambda self: self[1])
    parse = property(lambda self: self[2])
    default = property(lambda self: self[3])
    accepted = property(lambda self: self[4])
    meaning = property(lambda self: self[5])


# The core's own variables; each quirk declares the ones it reads next to its code.
CORE_VARIABLES = (
    Variable(
        "NRL_SHIM",
        "enabled",
        parse_bool,
        None,
        "`1` / `0` (also true/false, yes/no, on/off)",
        "`1`: activate in every interpreter; `0`: off everywhere; unset: only `import nrl_shim` / "
        "`nrl-shim run` activate",
    ),
    Variable(
        "NRL_SHIM_DISABLE",
        "disabled",
        None,
        frozenset(),
        "comma list of quirk ids, or `*`",
        "skip these fixes (an unknown id lists the valid ones); `vllm-rollout-sampling` names "
        "`vllm-sampling-defaults`, `vllm-trainer-logprobs` and `vllm-strict-tool-calling`",
    ),
    Variable(
        "NRL_SHIM_STRICT",
        "strict",
        parse_bool,
        False,
        "`1` / `0`",
        "a fix that can't be applied (a release with its bug it can't reach, target missing) is an error "
        "(`QuirkSkippedError`) instead of one warning: at start-up, or, for a fix that names its case (a LoRA "
        "adapter served), when that case happens; a release without the bug is never an error",
    ),
    Variable(
        "NRL_SHIM_LOG_LEVEL",
        "log_level",
        parse_level,
        20,
        "`DEBUG`, `INFO`, `WARNING`, `ERROR`, `CRITICAL`",
        "level of the `nrl_shim` logger",
    ),
    Variable(
        "NRL_SHIM_REPORT_DIR",
        "report_dir",
        parse_directory,
        None,
        "an absolute directory, or `off`",
        "every process of the job records there what each fix did (`nrl-shim report`); `nrl-shim run` sets a new "
        "one per job unless you set it; unset or `off` otherwise: no records",
    ),
)


# Settings both engines' fixes read (vLLM's and SGLang's): declared once here, outside either engine's folder, so that
# one variable means one thing on every engine and a job that mixes engines sets it once.
ENGINE_VARIABLES = (
    Variable(
        "NRL_SHIM_SAMPLING_DEFAULTS",
        "sampling_defaults",
        choice("rl", "serving"),
        "rl",
        "`rl` / `serving`",
        "`rl`: vLLM and SGLang engines sample as an RL trainer assumes where the user left the engine's defaults (no "
        "checkpoint generation_config sampling defaults, logprobs as the trainer computes them, vLLM's tool calls not "
        "grammar-constrained); `serving`: the engines' serving defaults (for a job that serves the checkpoint to users)",
    ),
    Variable(
        "NRL_SHIM_LOGPROBS",
        "logprobs",
        choice("auto", "full", "truncated"),
        "auto",
        "`auto` / `full` / `truncated`",
        "the logprobs a vLLM or SGLang engine returns where the caller left the engine's own choice: `auto`: "
        "`truncated` in a process running NeMo RL with training-time top-k/top-p (HEAD), else `full`; `full`: the "
        "full-vocabulary log_softmax(logits / T) before penalties, min-p, top-k and top-p (TRL, verl, a hand-written "
        "loop); `truncated`: renormalised over the tokens top-k/top-p/min-p keep, after penalties (vLLM's "
        "processed_logprobs; a trainer that filters its logits the same way: NeMo RL's training-time top-k/top-p)",
    ),
    Variable(
        "NRL_SHIM_PROBE",
        "probe",
        choice("on", "off"),
        "on",
        "`on` / `off`",
        "the refit probe in every engine process (docs/probe.md): after each refit, an exact digest of the weights "
        "checked against the earlier versions and the tensors sent (one WARNING per finding; strict mode: an error at "
        "the engine's next step), each prefix-cache hit after a refit checked for KV computed before it (vLLM V1), and "
        "each replica's versions in the job report; `off`: none of it",
    ),
)
# What the registry declares besides the quirks' own SETTINGS: the core's, then the engines' shared ones.
SHARED_VARIABLES = CORE_VARIABLES + ENGINE_VARIABLES


def as_text(value: "Any") -> str:
    """A setting's value as a user writes it in the environment."""
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):  # a log level
        return next((name for name, level in _LEVELS.items() if level == value), str(value))
    if isinstance(value, (tuple, frozenset)):
        return ",".join(sorted(value) if isinstance(value, frozenset) else value) or "(none)"
    return str(value)


class Settings:
    """The effective configuration of the shim: one attribute per declared variable. Immutable; build it with
    registry.load_settings() (every variable) or Settings.from_env(environ, variables=...)."""

    __slots__ = ("_values", "_variables")

    def __init__(self, values: "Mapping[str, Any]", variables: "Iterable[Variable]" = SHARED_VARIABLES) -> None:
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_variables", tuple(variables))

    def __getattr__(self, name: str) -> "Any":
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"Settings has no {name!r}; declared: {', '.join(self._values)}") from None

    def __setattr__(self, name: str, value: "Any") -> None:
        raise AttributeError("Settings is immutable; build a new one with registry.load_settings()")

    def __repr__(self) -> str:
        return "Settings(" + ", ".join(f"{a}={v!r}" for a, v in self._values.items()) + ")"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Settings) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, repr(v)) for k, v in self._values.items())))

    def as_dict(self) -> "dict[str, Any]":
        return dict(self._values)

    def as_environment(self) -> "dict[str, str]":
        """{variable: value} as a user writes them in the environment (doctor's effective settings)."""
        return {v.name: as_text(self._values[v.attr]) for v in self._variables}

    def is_enabled(self, quirk_id: str) -> bool:
        """Whether the fix `quirk_id` runs; for an old id in ALIASES, whether every fix it names does."""
        if quirk_id in ALIASES:
            return all(self.is_enabled(part) for part in ALIASES[quirk_id])
        return "*" not in self.disabled and quirk_id not in self.disabled

    @classmethod
    def from_env(
        cls,
        environ: "Mapping[str, str] | None" = None,
        known_ids: "Iterable[str] | None" = None,
        variables: "Iterable[Variable]" = SHARED_VARIABLES,
    ) -> "Settings":
        """Parse `variables` from `environ` (default os.environ); raise SettingsError naming the first bad one.
        `known_ids` validates NRL_SHIM_DISABLE."""
        environ = os.environ if environ is None else environ
        values = {}
        for name, attr, parse, default, _accepted, _meaning in variables:  # unpacked: no property call per field
            if parse is None:
                continue
            raw = environ.get(name)
            values[attr] = parse(name, raw) if raw and raw.strip() else default
        values["disabled"] = _parse_disable(environ.get("NRL_SHIM_DISABLE", ""), known_ids)
        return cls(values, variables)


def _parse_disable(raw: str, known_ids: "Iterable[str] | None") -> "frozenset[str]":
    """The ids NRL_SHIM_DISABLE names, an old id in ALIASES replaced by the ids it names."""
    given = frozenset(item.strip() for item in raw.split(",") if item.strip())
    if "*" in given:
        if len(given) > 1:
            _fail("NRL_SHIM_DISABLE", raw, "either * alone or a comma list of quirk ids")
        return given
    ids = frozenset(part for item in given for part in ALIASES.get(item, (item,)))
    if known_ids is None:
        return ids
    known = sorted(known_ids)
    unknown = sorted(item for item in given if item not in ALIASES and item not in known)
    if unknown:
        aliases = "; ".join(f"{old} (= {', '.join(parts)})" for old, parts in ALIASES.items())
        _fail(
            "NRL_SHIM_DISABLE",
            raw,
            f"* or a comma list of: {', '.join(known)}; old names: {aliases} (unknown: {', '.join(unknown)})",
        )
    return ids
