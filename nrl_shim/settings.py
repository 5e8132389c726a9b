"""All NRL_* variables, parsed and validated once into one Settings object.

Stdlib only, no dataclasses/typing/logging: this runs at start-up of every interpreter when NRL_SHIM=1.
"""

import math
import os

from .errors import SettingsError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_LEVELS = {"CRITICAL": 50, "ERROR": 40, "WARNING": 30, "WARN": 30, "INFO": 20, "DEBUG": 10}
GEMMA_LOAD_FORMAT_MODES = ("always", "affected", "off")


def _fail(name, raw, accepted):
    raise SettingsError(f"{name}={raw!r} is not valid; accepted: {accepted}")


def _bool(name, raw):
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    _fail(name, raw, "1 or 0 (also true/false, yes/no, on/off)")


def _level(name, raw):
    value = raw.strip()
    if value.upper() in _LEVELS:
        return _LEVELS[value.upper()]
    _fail(name, raw, "a logging level name: DEBUG, INFO, WARNING, ERROR or CRITICAL")


def _seconds(name, raw):
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        _fail(name, raw, "a positive, finite number of seconds, e.g. 600 or 1.5")
    return value


def _word(name, raw):
    # A recipe name or a glob: one token, printable, no separators that would make it ambiguous in a list.
    value = raw.strip()
    if not value or not value.isprintable() or any(c.isspace() or c == "," for c in value):
        _fail(name, raw, "one non-empty name without spaces, commas or control characters")
    return value


def _words(name, raw):
    return tuple(_word(name, item) for item in raw.split(",") if item.strip())


def _choice(choices):
    def parse(name, raw):
        value = raw.strip().lower()
        if value not in choices:
            _fail(name, raw, " | ".join(choices))
        return value

    return parse


# name -> (attribute, parser, default text, description). README's variable table mirrors this.
VARIABLES = {
    "NRL_SHIM": ("enabled", _bool, "unset", "1: activate in every Python process (via the installed .pth); 0: off, even on `import nrl_shim`"),
    "NRL_SHIM_DISABLE": ("disabled", None, "", "comma list of quirk ids to skip, or * for all"),
    "NRL_SHIM_STRICT": ("strict", _bool, "0", "1: a fix that cannot be applied is an error instead of a warning"),
    "NRL_SHIM_LOG_LEVEL": ("log_level", _level, "INFO", "level of the `nrl_shim` logger"),
    "NRL_SHIM_RECIPE": ("recipe", _word, "", "recipe name (e.g. grpo-deepscaler-1.5b-8K); detected from --config when unset"),
    "NRL_SHIM_EAGER_RECIPES": ("eager_recipes", _words, "", "extra comma list of recipe globs that need enforce_eager=True"),
    "NRL_SHIM_GEMMA_LOAD_FORMAT": ("gemma_load_format", _choice(GEMMA_LOAD_FORMAT_MODES), "always", "always | affected (vLLM < 0.9.2 only) | off"),
    "NRL_SHIM_RAY_SHIP": ("ray_ship", _bool, "1", "1: ship the shim to every Ray worker of the job (py_modules + worker setup hook); 0: NRL_* env_vars only"),
    "NRL_VLLM_USE_V1": ("vllm_use_v1", _bool, "1", "1: vLLM V1 engine; 0: V0 (vLLM < 0.11 only; never with the async engine)"),
    "NRL_VLLM_ASYNC_TIMEOUT_SECONDS": ("async_timeout_s", _seconds, "600", "max wait for each next output of an async rollout"),
}


class Settings:
    """The effective configuration of the shim. Immutable; build it with Settings.from_env()."""

    __slots__ = tuple(attr for attr, *_ in VARIABLES.values())

    def __init__(self, **values):
        for attr in self.__slots__:
            object.__setattr__(self, attr, values[attr])

    def __setattr__(self, name, value):
        raise AttributeError("Settings is immutable; build a new one with Settings.from_env()")

    def __repr__(self):
        return "Settings(" + ", ".join(f"{a}={getattr(self, a)!r}" for a in self.__slots__) + ")"

    def __eq__(self, other):
        return isinstance(other, Settings) and self.as_dict() == other.as_dict()

    def as_dict(self):
        return {a: getattr(self, a) for a in self.__slots__}

    def as_environment(self):
        """{variable: value} as a user writes them in the environment (doctor's effective settings)."""
        return {name: _as_text(getattr(self, attr)) for name, (attr, *_rest) in VARIABLES.items()}

    def is_enabled(self, quirk_id):
        return "*" not in self.disabled and quirk_id not in self.disabled

    @classmethod
    def from_env(cls, environ=None, known_ids=None):
        """Parse every variable; raise SettingsError naming the first bad one. `known_ids` validates NRL_SHIM_DISABLE."""
        environ = os.environ if environ is None else environ
        values = {}
        for name, (attr, parse, default, _doc) in VARIABLES.items():
            raw = environ.get(name)
            if parse is None:
                continue
            if raw is None or not raw.strip():
                raw = None
            values[attr] = parse(name, raw) if raw is not None else _DEFAULTS[attr]
        values["disabled"] = _parse_disable(environ.get("NRL_SHIM_DISABLE", ""), known_ids)
        return cls(**values)


_DEFAULTS = {
    "enabled": None,  # unset: `import nrl_shim` activates, the .pth does not
    "strict": False,
    "log_level": 20,
    "recipe": None,
    "eager_recipes": (),
    "gemma_load_format": "always",
    "ray_ship": True,
    "vllm_use_v1": True,
    "async_timeout_s": 600.0,
}


def _as_text(value):
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


def _parse_disable(raw, known_ids):
    ids = frozenset(item.strip() for item in raw.split(",") if item.strip())
    if "*" in ids:
        if len(ids) > 1:
            _fail("NRL_SHIM_DISABLE", raw, "either * alone or a comma list of quirk ids")
        return ids
    unknown = sorted(ids - set(known_ids)) if known_ids is not None else []
    if unknown:
        _fail("NRL_SHIM_DISABLE", raw, f"* or a comma list of: {', '.join(sorted(known_ids))} (unknown: {', '.join(unknown)})")
    return ids
