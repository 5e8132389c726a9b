"""Helpers for the context-parallel tests: real gloo process groups on CPU, one fresh interpreter per rank.

Parent side (pytest): run_ranks(child, world_size) starts `world_size` interpreters running the child program
tests/children/<child>.py (like torchrun), each rank prints one JSON document; the list of them is returned. Rank side
(in the child program): `from cp_helpers import init, ...` (run_ranks puts tests/ on the ranks' PYTHONPATH).
"""

import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

TESTS_DIR = str(Path(__file__).resolve().parent)


# --------------------------------------------------------------------------------------------------- parent side
def run_ranks(child, world_size, env=None, timeout=300, python=None):
    from conftest import child_env, child_path

    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for rank in range(world_size):
            extra = {
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "CP_TEST_STORE": os.path.join(tmp, "store"),
                "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": "1",
            }
            proc_env = child_env({**extra, **(env or {})})
            proc_env["PYTHONPATH"] = os.pathsep.join([TESTS_DIR, proc_env["PYTHONPATH"]])
            procs.append(
                subprocess.Popen(
                    [python or sys.executable, child_path(child)],
                    env=proc_env,
                    text=True,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            )
        outputs = []
        try:
            for proc in procs:
                out, err = proc.communicate(timeout=timeout)
                outputs.append((proc.returncode, out, err))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
    for rank, (rc, out, err) in enumerate(outputs):
        if rc != 0 or not out.strip():
            raise AssertionError(f"rank {rank} failed (rc={rc})\n--- stdout\n{out}\n--- stderr\n{err}")
    return [json.loads(out.strip().splitlines()[-1]) for _rc, out, _err in outputs]


# ----------------------------------------------------------------------------------------------------- rank side
def init():
    """Join the gloo group of this run; return (rank, world_size, 1-D CPU DeviceMesh over all ranks)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo", init_method="file://" + os.environ["CP_TEST_STORE"], rank=rank, world_size=world_size
    )
    return rank, world_size, init_device_mesh("cpu", (world_size,))


def context_parallel(mesh, *buffers):
    """torch's public context_parallel, looked up at each call (so a re-activated shim is seen), sharding dim 1."""
    import torch.distributed.tensor.experimental as experimental

    return experimental.context_parallel(mesh, buffers=list(buffers), buffer_seq_dims=[1] * len(buffers))


def reactivate(disable=""):
    """Re-activate the shim with NRL_SHIM_DISABLE=disable, as a process started with that variable would be."""
    import nrl_shim

    os.environ["NRL_SHIM_DISABLE"] = disable
    nrl_shim.deactivate()
    nrl_shim.activate()


def outcome(fn):
    """Run fn(); describe its result or exception as JSON-able data."""
    from nrl_shim import ShimError

    try:
        value = fn()
    except Exception as exc:  # the tests assert on the exact type and message
        return {
            "ok": False,
            "type": type(exc).__name__,
            "shim": isinstance(exc, ShimError),
            "value_error": isinstance(exc, ValueError),
            "msg": str(exc),
            "where": traceback.extract_tb(exc.__traceback__)[-1].filename,
        }
    return {"ok": True, "value": list(value.shape) if hasattr(value, "shape") else value}


def sdpa_is_torchs():
    """True when torch.nn.functional.scaled_dot_product_attention is torch's own builtin again."""
    import torch
    import torch.nn.functional as F

    return F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


def tiny_llama(seed=0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval()


def tiny_gemma3(sliding_window=4, seed=0):
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=sliding_window,
        attn_implementation="sdpa",
    )
    return Gemma3ForCausalLM(config).eval()


def tiny_gemma3_multimodal(seed=0):
    """A tiny Gemma3ForConditionalGeneration (text + SigLIP vision tower), for a text-only forward."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

    torch.manual_seed(seed)
    text = Gemma3TextConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=4,
    )
    vision = SiglipVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=4
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_index=127,
        boi_token_index=125,
        eoi_token_index=126,
        attn_implementation="sdpa",
    )
    return Gemma3ForConditionalGeneration(config).eval()


def finish(results):
    print(json.dumps(results))


def phases(run_case_set):
    """Run run_case_set() once per entry of the JSON list CP_TEST_PHASES (values for NRL_SHIM_DISABLE), re-activating
    the shim in between; the first phase uses the environment the process started with. Returns {phase: results}."""
    import nrl_shim

    results = {}
    for i, disable in enumerate(json.loads(os.environ["CP_TEST_PHASES"])):
        if i or os.environ.get("NRL_SHIM_DISABLE", "") != disable:
            reactivate(disable)
        assert nrl_shim.is_active()
        results[disable or "none"] = run_case_set()
    return results


def run(child, world_size, phases_, start_disabled="", python=None):
    """Parent side: run_ranks with the phases list; the process starts with NRL_SHIM_DISABLE=start_disabled (in
    `python`, default this interpreter)."""
    env = {"CP_TEST_PHASES": json.dumps(phases_), "NRL_SHIM_DISABLE": start_disabled}
    return run_ranks(child, world_size, env=env, python=python)


# Errors torch itself raises for SDPA under CP on CPU (no CP handler for the CPU kernels): the spec's "sharding
# strategy" one, and on torch <= 2.9 with transformers' arguments the math fallback's "mixed torch.Tensor and DTensor".
TORCH_CPU_CP_ERRORS = ("does not have a sharding strategy registered", "got mixed torch.Tensor and DTensor")
# What torch itself says when a mask reaches CP's SDPA (the errors the issue quotes).
TORCH_MASK_ERRORS = ("Sharding dim 2 greater than tensor ndim 2", "Attempting to broadcast a dimension")


def is_torch_error(out, *fragments):
    """out is an exception raised by torch itself (not the shim) whose message contains one of fragments."""
    return (
        not out["ok"]
        and not out["shim"]
        and f"{os.sep}torch{os.sep}" in out["where"]
        and any(f in out["msg"] for f in fragments)
    )


def cp_wrapped():
    """(context_parallel carries the shim's layer, the public name torch users import is that same object)."""
    import torch.distributed.tensor.experimental as experimental

    from nrl_shim.patching import is_wrapped
    from nrl_shim.quirks.torch_cp import _common as _torch_cp

    real = _torch_cp._real_module()
    return [
        is_wrapped(real, "context_parallel", _torch_cp._LAYER),
        experimental.context_parallel is real.context_parallel,
    ]
