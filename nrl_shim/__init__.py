"""nrl-shim: known model-specific fixes for vLLM rollouts and torch FSDP2 context parallel, for unmodified RL code.

`import nrl_shim` activates it in this process (and, through NRL_SHIM=1 in the environment, in every child).
"""

import os as _os
import sys as _sys

# Only the copy shipped to Ray workers has _vendor (wrapt, packaging): appended, so a worker's own copies win.
_VENDOR = _os.path.join(_os.path.dirname(__file__), "_vendor")
if _os.path.isdir(_VENDOR) and _VENDOR not in _sys.path:
    _sys.path.append(_VENDOR)

from .activation import activate, active_settings, deactivate, is_active
from .settings import Settings

TYPE_CHECKING = False  # not typing's: this runs at every interpreter start-up
if TYPE_CHECKING:
    from .errors import (
        PluginError,
        QuirkSkippedError,
        RefitIncompleteError,
        SettingsError,
        ShimError,
        ShimTimeoutError,
        UnsupportedConfigError,
    )
_ERRORS = frozenset(
    (
        "ShimError",
        "SettingsError",
        "UnsupportedConfigError",
        "QuirkSkippedError",
        "ShimTimeoutError",
        "RefitIncompleteError",
        "PluginError",
    )
)

__version__ = "0.1.0"
__all__ = [
    "activate",
    "deactivate",
    "is_active",
    "active_settings",
    "Settings",
    "ShimError",
    "SettingsError",
    "UnsupportedConfigError",
    "QuirkSkippedError",
    "ShimTimeoutError",
    "RefitIncompleteError",
    "PluginError",
]


def __getattr__(name: str) -> type:
    # The error classes load on first use (`nrl_shim.ShimError`, `from nrl_shim import ShimError`): creating them costs
    # start-up time in every interpreter, and most never raise one.
    if name in _ERRORS:
        from . import errors

        value = globals()[name] = getattr(errors, name)  # found directly from now on
        return value
    raise AttributeError(f"module 'nrl_shim' has no attribute {name!r}")


from . import activation as _activation  # noqa: E402

_activation.activate_on_import()
