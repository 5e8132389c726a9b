"""Stand-in for `sgl_kernel` (SGLang's C++/CUDA kernels, PyPI distribution sglang-kernel), which has no CPU build on
PyPI: SGLang's CPU path imports the names below at module level (under `if _is_cpu:`), so `import sglang...` fails
without them. Each raises NotImplementedError when called: nothing real can run them here. None is called by the
engines of the tests (a dense Llama, torch_native attention, no speculative decoding); README.md beside this file
says which module imports each and what it serves. Only on PYTHONPATH in an SGLang test's processes.

Defining no `torch.ops.sgl_kernel` operators keeps SGLang off its Intel AMX backend
(`sglang.srt.utils.common._is_intel_amx_backend_available` checks for `convert_weight_packed` there).
"""


def _not_here(name: str):
    def kernel(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name}: SGLang's C++ CPU kernels are not installed here (tests/sglang_cpu/sgl_kernel is a "
            "stand-in so that SGLang imports); this engine configuration needs the real sglang-kernel CPU build"
        )

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


# sglang/srt/mem_cache/allocation.py
assign_req_to_token_pool_cpu = _not_here("assign_req_to_token_pool_cpu")
# sglang/kernels/ops/kvcache/cache_move.py
copy_all_layer_kv_cache_cpu = _not_here("copy_all_layer_kv_cache_cpu")
# sglang/kernels/ops/speculative/eagle.py
fill_accept_out_cache_loc_cpu = _not_here("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _not_here("fill_bonus_tokens_cpu")
# sglang/kernels/ops/speculative/cache_locs.py
assign_draft_cache_locs_contiguous_cpu = _not_here("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _not_here("assign_extend_cache_locs_cpu")
# sglang/kernels/ops/speculative/spec_tree.py
build_tree_kernel_efficient_cpu = _not_here("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _not_here("verify_tree_greedy_cpu")
