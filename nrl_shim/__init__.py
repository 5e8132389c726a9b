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
from .errors import (
    QuirkSkippedError,
    RefitIncompleteError,
    SettingsError,
    ShimError,
    ShimTimeoutError,
    UnsupportedConfigError,
)
from .settings import Settings

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
]

from . import activation as _activation  # noqa: E402

_activation.activate_on_import()
