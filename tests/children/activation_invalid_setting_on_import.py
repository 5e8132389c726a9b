"""An invalid NRL_SHIM_DISABLE at `import nrl_shim`: print the error's type and message."""

import os

os.environ["NRL_SHIM_DISABLE"] = "no-such-quirk"
try:
    import nrl_shim  # noqa: F401
except ValueError as err:
    print(type(err).__name__, "|", err)
