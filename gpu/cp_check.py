"""One-GPU check of the context-parallel guard (issue 4). Run from the repository root on a machine with one CUDA GPU:

    python gpu/cp_check.py            # prints one JSON line; also writes $OUT/cp_check.json when OUT is set

What it checks, on a real CUDA DeviceMesh of size 1 (a one-rank NCCL group), with the shim active:
1. a tiny Llama (attn_implementation="sdpa", bf16) under context_parallel runs (CP's flash/efficient SDPA handlers are
   CUDA-only, so this is the path CPU tests cannot take) and its logits match the same forward without CP;
2. a tiny Gemma-3 under context_parallel gets the shim's UnsupportedConfigError (cp-gemma3), not torch's
   "attn_bias is not supported yet";
3. SDPA with an attn_mask under context_parallel gets the shim's error (cp-attention-mask);
4. after each, torch.nn.functional.scaled_dot_product_attention is torch's own again.
Exit status 0 only when all pass. Needs torch and transformers (any version the shim supports); no downloads.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's nrl_shim, even if not installed

import nrl_shim  # noqa: E402  (activates the shim before torch is imported, as NRL_SHIM=1 would)


def main():
    import torch
    import torch.distributed as dist
    import torch.distributed.tensor.experimental as experimental
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    # CP_CHECK_DEVICE=cpu: a smoke run of this script's own logic without a GPU (the Llama check then fails: CPU SDPA
    # has no CP handler).
    device = os.environ.get("CP_CHECK_DEVICE", "cuda")
    assert device == "cpu" or torch.cuda.is_available(), "this check needs a CUDA GPU"
    store = tempfile.mktemp(prefix="cp_check_store_")
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{store}", rank=0, world_size=1)
    if device == "cuda":
        torch.cuda.set_device(0)
    mesh = init_device_mesh(device, (1,))
    dtype, seq = (torch.bfloat16 if device == "cuda" else torch.float32), 256
    results = {"torch": torch.__version__, "shim_active": nrl_shim.is_active()}

    def under_cp(model):
        ids = (torch.arange(seq, device=device) % 100).view(1, seq)
        pos = torch.arange(seq, device=device).view(1, seq)
        # As NeMo RL does: CP inside an SDPA backend choice that CP has handlers for.
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            with experimental.context_parallel(mesh, buffers=[ids, pos], buffer_seq_dims=[1, 1]):
                return model(input_ids=ids, position_ids=pos).logits.float()

    def caught(fn):
        try:
            fn()
        except Exception as exc:
            return {"type": type(exc).__name__, "shim": isinstance(exc, nrl_shim.ShimError), "msg": str(exc)[:400]}
        return None

    torch.manual_seed(0)
    llama = (
        LlamaForCausalLM(
            LlamaConfig(
                vocab_size=128,
                hidden_size=256,
                intermediate_size=512,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=512,
                attn_implementation="sdpa",
            )
        )
        .to(device, dtype)
        .eval()
    )
    with torch.no_grad():
        ids = (torch.arange(seq, device=device) % 100).view(1, seq)
        reference = llama(input_ids=ids, position_ids=torch.arange(seq, device=device).view(1, seq)).logits.float()
        try:
            got = under_cp(llama)
            diff = (got - reference).abs().max().item()
            results["llama"] = {"ran": True, "max_abs_diff": diff, "match": diff <= 2e-2}
        except Exception as exc:
            results["llama"] = {"ran": False, "error": f"{type(exc).__name__}: {str(exc)[:400]}", "match": False}
    results["llama"]["sdpa_restored"] = F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention

    torch.manual_seed(0)
    gemma = (
        Gemma3ForCausalLM(
            Gemma3TextConfig(
                vocab_size=128,
                hidden_size=256,
                intermediate_size=512,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=64,
                max_position_embeddings=512,
                sliding_window=64,
                attn_implementation="sdpa",
            )
        )
        .to(device, dtype)
        .eval()
    )
    with torch.no_grad():
        results["gemma3"] = caught(lambda: under_cp(gemma)) or {"shim": False, "msg": "no error"}
        results["gemma3"]["sdpa_restored"] = F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention

        def masked():
            ids = torch.arange(seq, device=device).view(1, seq)
            with experimental.context_parallel(mesh, buffers=[ids], buffer_seq_dims=[1]):
                q = torch.randn(1, 4, seq, 64, device=device, dtype=dtype)
                F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(seq, seq, device=device, dtype=torch.bool))

        results["mask"] = caught(masked) or {"shim": False, "msg": "no error"}

    checks = {
        "llama_matches_without_cp": results["llama"]["match"] and results["llama"]["sdpa_restored"],
        "gemma3_shim_error": results["gemma3"]["shim"]
        and "Gemma3ForCausalLM" in results["gemma3"]["msg"]
        and results["gemma3"]["sdpa_restored"],
        "mask_shim_error": results["mask"]["shim"] and "attn_mask" in results["mask"]["msg"],
    }
    results["checks"], results["passed"] = checks, all(checks.values())
    dist.destroy_process_group()
    line = json.dumps(results)
    print(line)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "cp_check.json").write_text(line + "\n")
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
