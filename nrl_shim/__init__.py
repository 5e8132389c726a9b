"""nrl-shim: known model-specific fixes for vLLM rollouts and torch FSDP2 context parallel, for unmodified RL code.

`import nrl_shim` activates it in this process (and, through NRL_SHIM=1 in the environment, in every child).
"""

from .activation import activate, deactivate, is_active, settings
from .errors import QuirkSkippedError, SettingsError, ShimError, ShimTimeoutError, UnsupportedConfigError
from .settings import Settings

__version__ = "0.1.0"
__all__ = [
    "activate",
    "deactivate",
    "is_active",
    "settings",
    "Settings",
    "ShimError",
    "SettingsError",
    "UnsupportedConfigError",
    "QuirkSkippedError",
    "ShimTimeoutError",
]

from . import activation as _activation  # noqa: E402

_activation.activate_on_import()
