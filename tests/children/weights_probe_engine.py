"""Refits of real vLLM engines (CPU build) with the refit probe on, for test_vllm_weights_probe.py: `python
weights_probe_engine.py SCENARIO=MODEL_DIR...`. Each scenario gets a fresh engine (engine core in this process, so
the worker's model is reachable), refits it as RL frameworks do (the model's own load_weights, one call per bucket;
the CPU build's refit fix keeps that working for dummy-loaded engines) or reloads it from disk (vLLM's in-place
reload_weights, TRL#5312's shape), generates after each step, and records the probe's lines. Prints one JSON line {scenario: {...}}.
"""

import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for tiny_models
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

ENGINE_KW = dict(
    skip_tokenizer_init=True, dtype="float32", max_model_len=128, enforce_eager=True, gpu_memory_utilization=0.05
)
PROBE = "[vllm-weights-probe]"
PROMPT = [{"prompt_token_ids": [5, 17, 42, 7, 9]}]
# Longer than one KV block (128 tokens on the CPU build), within the tiny model's 256 positions: a prefix the cache
# keeps across a refit.
LONG = [(i * 37) % 500 + 3 for i in range(240)]


def perturbed(items, seed):
    """The checkpoint's tensors after a training step: each moved by seeded noise (a policy in training)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return [(n, t + 0.05 * torch.randn(t.shape, generator=generator)) for n, t in items]


def run(model_dir, scenario):
    import gc

    from log_records import Records, error_line
    from vllm import LLM, SamplingParams

    from tiny_models import state_dict_items

    records = Records()
    logging.getLogger("nrl_shim").addHandler(records)
    load_format = "auto" if scenario.startswith("reload") else "dummy"
    engine_kw = dict(ENGINE_KW, max_model_len=256) if scenario == "prefix" else ENGINE_KW
    llm = LLM(model=model_dir, load_format=load_format, **engine_kw)
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    params = SamplingParams(temperature=0, max_tokens=6, detokenize=False)
    tokens, logprobs, error = [], [], None

    def generate(prompt=PROMPT):
        out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
        tokens.append(list(out.token_ids))
        logprobs.append([next(iter(step.values())).logprob for step in out.logprobs or ()])

    def refit(batches):
        for batch in batches:  # NeMo RL's, verl's and TRL's route (the CPU build's refit fix keeps it working)
            runner.model.load_weights(iter(batch))

    checkpoint = state_dict_items(model_dir)
    step1, step2 = perturbed(checkpoint, 1), perturbed(checkpoint, 2)
    try:
        if scenario == "quiet":
            refit([checkpoint])  # the first sync over dummy weights
            generate()
            third = len(step1) // 3  # a bucketed transfer: three calls
            refit([step1[:third], step1[third : 2 * third], step1[2 * third :]])
            generate()
            refit([step1])  # the same tensors again (a re-sync with no training step between): not a finding
            generate()
            refit([step2])
            generate()
        elif scenario.startswith("reload"):  # TRL#5312's shape: the checkpoint reloaded over the sync
            generate()  # the checkpoint's tokens
            refit([step1])
            generate()  # the synced policy's tokens
            runner.reload_weights()  # vLLM's reload from the checkpoint on disk
            generate()  # served from the checkpoint again
        elif scenario == "under":  # a write into a parameter outside any refit
            refit([checkpoint])
            generate()
            import torch

            with torch.no_grad():
                runner.model.get_parameter("model.norm.weight").add_(0.5)
            generate()
            refit([step1])
            generate()
        elif scenario == "prefix":  # a shared prompt across a refit: served from the prefix cache, then recomputed
            params = SamplingParams(temperature=0, max_tokens=6, detokenize=False, logprobs=0)
            refit([checkpoint])
            generate([{"prompt_token_ids": LONG}])  # its first two blocks cached, computed by the checkpoint
            refit([step1])
            generate([{"prompt_token_ids": LONG}])  # served as a user request would be (the prefix cache allowed)
            generate([{"prompt_token_ids": LONG, "cache_salt": "recompute"}])  # the same, recomputed from scratch
        elif scenario == "head":  # the LM head alone refit (the CPU build packs it at load: its kernel copy stays)
            generate()  # the dummy weights' tokens
            refit([[(n, t) for n, t in checkpoint if n.startswith("lm_head.")]])
            generate()  # the checkpoint's LM head, if the engine computes from the parameter the refit wrote
        elif scenario == "nowhere":  # names the model does not have, which vLLM's loader skips (unexpected biases)
            biases = [(n.replace(".weight", ".bias"), t[:, 0].clone()) for n, t in step1 if n.endswith("q_proj.weight")]
            refit([checkpoint])
            generate()
            refit([biases])
            generate()
            refit([[(n, t + 1.0) for n, t in biases]])  # changed since they were last sent: lands nowhere
            generate()
    except Exception as exc:
        error = error_line(exc)
    from nrl_shim.quirks.vllm.refit import weights_probe

    gaps = [probe.live_gap for probe in weights_probe._probes().values()]  # check d's largest gap (the kernel noise)
    logging.getLogger("nrl_shim").removeHandler(records)
    llm = runner = None  # the engine goes with its last reference
    gc.collect()
    return {
        "live_gaps": gaps,
        "probe": [(level, m) for level, m in records.messages if m.startswith(PROBE)],
        "warnings": [m for level, m in records.messages if level in ("WARNING", "ERROR")],
        "tokens": tokens,
        "logprobs": logprobs,
        "error": error,
    }


if __name__ == "__main__":
    cases = dict(arg.split("=", 1) for arg in sys.argv[1:])
    print(json.dumps({scenario: run(model_dir, scenario) for scenario, model_dir in cases.items()}))
