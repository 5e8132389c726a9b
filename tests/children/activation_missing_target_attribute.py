"""The function a quirk patches is missing from its module: the shim warns, skips it and stays active."""

import ray._private.worker as w

del w.init  # a release where the function we patch does not exist
import nrl_shim  # noqa: E402

print("alive", nrl_shim.is_active())
