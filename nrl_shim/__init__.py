"""nrl-shim: known model-specific fixes for vLLM rollouts and torch FSDP2 context parallel, for unmodified RL code.

`import nrl_shim` activates it in this process (and, through NRL_SHIM=1 in the environment, in every child). At
interpreter start-up with NRL_SHIM=1 (the .pth, or nrl_shim/_bootstrap's sitecustomize) it is armed instead: it loads
at the first import of a quirk's target (nrl_shim/_startup.py).
"""

import os as _os
import sys as _sys

# Only the copy shipped to Ray workers has _vendor (wrapt, packaging): appended, so a worker's own copies win.
_VENDOR = _os.path.join(_os.path.dirname(__file__), "_vendor")
if _os.path.isdir(_VENDOR) and _VENDOR not in _sys.path:
    _sys.path.append(_VENDOR)

TYPE_CHECKING = False  # not typing's: this runs at every interpreter start-up
if TYPE_CHECKING:
    from typing import Any

    from .activation import activate, active_settings, deactivate, is_active
    from .errors import (
        PluginError,
        QuirkSkippedError,
        RefitIncompleteError,
        SettingsError,
        ShimError,
        ShimTimeoutError,
        UnsupportedConfigError,
    )
    from .settings import Settings
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


_API = frozenset(("activate", "deactivate", "is_active", "active_settings"))  # nrl_shim.activation's


def __getattr__(name: str) -> "Any":
    # The API and the error classes load on first use (`nrl_shim.activate`, `from nrl_shim import ShimError`): at
    # interpreter start-up the shim is only armed (nrl_shim/_startup.py), and most interpreters never call them.
    if name in _API:
        from . import activation

        value = getattr(activation, name)
    elif name in _ERRORS:
        from . import errors

        value = getattr(errors, name)
    elif name == "Settings":
        from .settings import Settings as value
    else:
        raise AttributeError(f"module 'nrl_shim' has no attribute {name!r}")
    globals()[name] = value  # found directly from now on
    return value


def _complete_activation(how: str) -> None:
    """Complete an armed start-up (nrl_shim/_startup.py calls it): activation, whose finder takes the watcher's place."""
    from . import activation

    activation.activate(how=how)


def _activate_on_import() -> None:
    # `import nrl_shim` activates, unless NRL_SHIM is explicitly off; the CLI validates and reports settings itself
    # (doctor, run) and patches nothing in its own process. At interpreter start-up the shim is armed where that is
    # equivalent (nrl_shim/_startup.py); otherwise activation runs now.
    if _os.environ.get("NRL_SHIM", "").strip().lower() in _startup.FALSE:
        return
    if _os.path.basename(_sys.argv[0] if getattr(_sys, "argv", None) else "") == "nrl-shim":
        return
    by_site = _startup.imported_by_site()
    if by_site and _startup.arm(by_site, _complete_activation):
        return
    from . import activation

    activation.activate_on_import(by_site)


from . import _startup  # noqa: E402

_activate_on_import()
