"""Fixes for SGLang (see nrl_shim/quirks/__init__.py). Stdlib only: imported with the first of them."""
