"""Fixes for Ray: the shim in every worker of a job (see nrl_shim/quirks/__init__.py). Stdlib only."""
