"""Fixes for SGLang (see nrl_shim/quirks/__init__.py). Stdlib only: imported with the first of them.

Version ranges several SGLang fixes share, read in the wheels and run on real engines (tests marked `sglang`).
"""

# The radix key's `extra_key` namespace (RadixKey, Req.extra_key): from 0.5.12.
SGLANG_EXTRA_KEY_SINCE = ">=0.5.12"
# Run on real CPU engines: 0.5.12.post1 (NeMo RL HEAD's pin) and 0.5.23 (newest); the releases between read.
SGLANG_VERIFIED = ">=0.5.12,<0.5.24"
