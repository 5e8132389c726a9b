"""Stand-in for `sgl_kernel.kvcacheio` (HiCache's host-pool KV transfer kernels): SGLang 0.5.12.post1's
`sglang/srt/mem_cache/memory_pool_host.py` imports these at module level on every device but NPU/XPU/MPS (0.5.23 no
longer does on the CPU). Each raises NotImplementedError when called; the tests' engines use no host KV pool."""

from sgl_kernel import _not_here

transfer_kv_all_layer = _not_here("kvcacheio.transfer_kv_all_layer")
transfer_kv_all_layer_direct_lf_pf = _not_here("kvcacheio.transfer_kv_all_layer_direct_lf_pf")
transfer_kv_all_layer_lf_pf = _not_here("kvcacheio.transfer_kv_all_layer_lf_pf")
transfer_kv_all_layer_lf_ph = _not_here("kvcacheio.transfer_kv_all_layer_lf_ph")
transfer_kv_all_layer_mla = _not_here("kvcacheio.transfer_kv_all_layer_mla")
transfer_kv_all_layer_mla_lf_pf = _not_here("kvcacheio.transfer_kv_all_layer_mla_lf_pf")
transfer_kv_direct = _not_here("kvcacheio.transfer_kv_direct")
transfer_kv_per_layer = _not_here("kvcacheio.transfer_kv_per_layer")
transfer_kv_per_layer_direct_pf_lf = _not_here("kvcacheio.transfer_kv_per_layer_direct_pf_lf")
transfer_kv_per_layer_mla = _not_here("kvcacheio.transfer_kv_per_layer_mla")
transfer_kv_per_layer_mla_pf_lf = _not_here("kvcacheio.transfer_kv_per_layer_mla_pf_lf")
transfer_kv_per_layer_pf_lf = _not_here("kvcacheio.transfer_kv_per_layer_pf_lf")
transfer_kv_per_layer_ph_lf = _not_here("kvcacheio.transfer_kv_per_layer_ph_lf")
