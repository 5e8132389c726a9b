"""Fixes for SGLang (see nrl_shim/quirks/__init__.py). Stdlib only: imported with the first of them.

Version ranges several SGLang fixes share, read in the wheels and run on real engines (tests marked `sglang`).
"""

# The first release the SGLang fixes are declared for: 0.5.10 (AReaL's pin is 0.5.10.post1). Every name they use, the
# radix key's `extra_key` namespace (RadixKey, Req.extra_key) included, read in each wheel 0.5.10 -> 0.5.23.
SGLANG_SINCE = ">=0.5.10"
# Run on real CPU engines: 0.5.10.post1 (AReaL's pin), 0.5.12.post1 (NeMo RL HEAD's pin) and 0.5.23 (newest); the
# releases between read.
SGLANG_VERIFIED = ">=0.5.10,<0.5.24"
