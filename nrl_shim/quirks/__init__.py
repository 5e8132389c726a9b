"""The built-in fixes, one folder per library they patch (as ddtrace's `contrib/internal/<lib>/`): `vllm/` (by what
the fixes protect: config, refit, sampling, runtime, models), `torch_cp/` (torch's context parallel and the
transformers code paths it runs), `ray/`, `sglang/`. One module per quirk, listed in pyproject.toml's entry points
(nrl_shim.registry), plus what several of one library share (`_common`, version ranges in the library's `__init__`);
`_hf_config` reads Hugging Face config files for fixes of any library.

Stdlib only in every `__init__` here: one is imported with the first quirk module of its library (when one of its
targets is imported, or its setup() has work in this process; activation reads nrl_shim/_quirk_index.py). Nothing in
an `__init__` imports a helper, so no import loop.
"""
