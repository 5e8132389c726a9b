"""Fixes for torch's context parallel and the transformers code paths it runs (see nrl_shim/quirks/__init__.py).
Stdlib only: imported with the first of them."""

# torch's context_parallel: verified 2.6, 2.7.1, 2.8, 2.9 (code in _attention.py), 2.13 and 2.14 (code in
# _context_parallel/_attention.py), i.e. through 2.15.
TORCH_CP_SINCE = ">=2.6"
TORCH_CP_VERIFIED = ">=2.6,<2.16"
TORCH_CP = TORCH_CP_VERIFIED  # as VLLM
# transformers' Gemma-3 and flash-attention code paths guarded under CP: from 4.51 on; verified on 4.51 - 5.x.
TRANSFORMERS_CP_SINCE = ">=4.51"
TRANSFORMERS_CP = ">=4.51,<6"
