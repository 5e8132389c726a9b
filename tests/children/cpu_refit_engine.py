"""Refits of real vLLM engines (CPU build) through the model's own `load_weights`, for test_vllm_cpu_refit.py:
`python cpu_refit_engine.py CASES.json`. Each case gets a fresh engine, generates greedily, then per listed refit:
refits (an error is recorded, not raised) and generates again. The shim is on or off as the environment the test gives this process says, as in a job.
Prints one JSON line: {"cases": {name: {...}}, "log": [[level, message], ...]} (the `nrl_shim` records).
"""

import gc
import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for tiny_models
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: the model is reachable

# A fixed KV cache (64 MiB): on the CPU build gpu_memory_utilization is a share of host memory minus this process's,
# which the engines before it in this process have already grown.
ENGINE_KW = dict(skip_tokenizer_init=True, max_model_len=128, enforce_eager=True, kv_cache_memory_bytes=64 << 20)


def layer_state(layer):
    """What vLLM's CPU dispatch left on a linear layer: the weight parameter's shape and which GEMM it calls."""
    import torch

    return {
        "weight_shape": list(layer.weight.shape),
        "live": layer.cpu_linear is torch.nn.functional.linear,
    }


def run(case):
    import vllm.model_executor.layers.utils as layer_utils

    check_sgl = layer_utils.check_cpu_sgl_kernel
    if case.get("cpu_says_amx"):  # as on a CPU with AMX: vLLM's sgl-kernel path, checked before oneDNN, takes bf16
        layer_utils.check_cpu_sgl_kernel = lambda n, k, dtype: (
            dtype in (torch_dtype("bfloat16"), torch_dtype("float16"))
        )
    try:
        return engine_case(case)
    finally:
        layer_utils.check_cpu_sgl_kernel = check_sgl


def torch_dtype(name):
    import torch

    return getattr(torch, name)


def engine_case(case):
    import torch
    from vllm import LLM, SamplingParams

    from tiny_models import state_dict_items

    llm = LLM(model=case["model"], load_format=case["load_format"], dtype=case["dtype"], **ENGINE_KW)
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    params = SamplingParams(temperature=0, max_tokens=case["max_tokens"], ignore_eos=True, detokenize=False)

    def generate():
        outputs = llm.generate([{"prompt_token_ids": p} for p in case["prompts"]], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]

    model = runner.model
    out = {
        "qkv_proj": layer_state(model.model.layers[0].self_attn.qkv_proj),
        "lm_head": layer_state(model.lm_head),
        "before": generate(),  # the packed engine generates fine before any refit
        "refits": [],  # per refit: {"error": str|None, "after": greedy tokens after it}
    }
    for refit in case["refits"]:
        items = state_dict_items(refit["model"])
        if refit.get("only"):  # a partial refit: the names containing one of these parts
            items = [(n, t) for n, t in items if any(part in n for part in refit["only"])]
        error = None
        try:
            if refit["via"] == "reload_weights":  # vLLM's in-place refit: re-runs the CPU packing layer by layer
                runner.reload_weights(weights_iterator=iter(items))
            else:  # what NeMo RL, verl, TRL and OpenRLHF call
                model.load_weights(items)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        head = dict(items).get("lm_head.weight")
        written = None if head is None else bool(torch.equal(model.lm_head.weight, head.to(model.lm_head.weight.dtype)))
        out["refits"].append({"error": error, "lm_head_written": written, "after": generate()})
    out["qkv_proj_after"] = layer_state(model.model.layers[0].self_attn.qkv_proj)
    return out  # the engine goes with this frame (collected before the next case)


if __name__ == "__main__":
    from log_records import Records  # next to this file (the script's directory is on sys.path)

    records = Records()
    logging.getLogger("nrl_shim").addHandler(records)
    cases = json.loads(sys.argv[1])
    results = {}
    for case in cases:
        results[case["name"]] = run(case)
        gc.collect()
    print(json.dumps({"cases": results, "log": records.messages}))
