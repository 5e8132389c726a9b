"""Every error the shim raises derives from ShimError and from the builtin a caller would expect to catch."""


class ShimError(Exception):
    """Base class of all nrl-shim errors."""


class SettingsError(ShimError, ValueError):
    """An NRL_* environment variable (or an argument) has a value the shim does not accept."""


class UnsupportedConfigError(ShimError, ValueError):
    """The user's configuration asks for something the installed libraries cannot do (e.g. V0 on vLLM >= 0.11)."""


class QuirkSkippedError(ShimError, RuntimeError):
    """Strict mode (NRL_SHIM_STRICT=1): a fix could not be applied, so the shim refuses to continue."""


class ShimTimeoutError(ShimError, TimeoutError):
    """An operation the shim bounds (e.g. waiting for an async rollout sample) ran out of time."""


class RefitIncompleteError(ShimError, RuntimeError):
    """Strict mode: a refit left a model's weights wrong or incomplete (dummy weights never refit, a write the shim
    can't bring into the kernel's layout on this release) and the model is about to generate from them."""


class PluginError(ShimError, RuntimeError):
    """Quirks from other packages (entry-point group `nrl_shim.quirks`) clash: two declare the same quirk id or setting,
    or (strict mode) one cannot be loaded."""


class ProbeFindingError(ShimError, RuntimeError):
    """Strict mode: the refit probe found the engine's weights are not the ones the trainer sent (docs/probe.md), and
    the engine is about to serve a request from them."""
