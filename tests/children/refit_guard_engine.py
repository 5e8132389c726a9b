"""Refits of real vLLM engines (CPU build), for test_vllm_refit_guard.py: `python refit_guard_engine.py
SCENARIO=MODEL_DIR...`. Each scenario gets a fresh engine, refits it the way RL frameworks do, generates twice and
records the `nrl_shim` warnings. Prints one JSON line {scenario: {"warnings": [...], "guarded": bool, "error": str|None}}.
"""

import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for tiny_models
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: the model runner is reachable

ENGINE_KW = dict(
    skip_tokenizer_init=True, dtype="float32", max_model_len=128, enforce_eager=True, gpu_memory_utilization=0.05
)


def layer_of(name):
    parts = name.split(".")
    return int(parts[2]) if name.startswith("model.layers.") else None


def refit_batches(scenario, items):
    """The (name, tensor) batches one refit sends, per scenario."""
    if scenario == "split":  # a bucketed transfer: three calls, a layer never straddling two
        return [
            [(n, t) for n, t in items if layer_of(n) == 0 or "embed" in n],
            [(n, t) for n, t in items if layer_of(n) == 1],
            [(n, t) for n, t in items if layer_of(n) is None and "embed" not in n],
        ]
    if scenario == "skip_layer":  # a bucket that never arrived
        return [[(n, t) for n, t in items if layer_of(n) != 1]]
    if scenario == "wrong_name":  # a name-mapping bug: two sources mapped to one target, one target never written
        wrong = {"model.layers.1.post_attention_layernorm.weight": "model.layers.1.input_layernorm.weight"}
        return [[(wrong.get(n, n), t) for n, t in items]]
    return [items]  # "full", "auto", "tied", "gemma"


def run(model_dir, scenario):
    import gc

    from log_records import Records, error_line  # next to this file (the script's directory is on sys.path)
    from vllm import LLM, SamplingParams

    from tiny_models import state_dict_items

    records = Records()
    logging.getLogger("nrl_shim").addHandler(records)
    load_format = "auto" if scenario == "auto" else "dummy"
    llm = LLM(model=model_dir, load_format=load_format, **ENGINE_KW)
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    guarded = hasattr(runner.model, "_nrl_shim_refit_guard")
    params = SamplingParams(temperature=0, max_tokens=4, detokenize=False)
    if scenario == "full":  # generating before any refit (a warm-up, a dummy rollout) is not checked
        llm.generate([{"prompt_token_ids": [5, 17, 42]}], params, use_tqdm=False)
    for batch in refit_batches(scenario, state_dict_items(model_dir)):
        runner.reload_weights(weights_iterator=iter(batch))  # vLLM's in-place refit (load_weights fails on CPU)
    error = None
    try:
        for _ in range(2):  # the second generation must not report again
            llm.generate([{"prompt_token_ids": [5, 17, 42]}], params, use_tqdm=False)
    except Exception as exc:  # strict mode: the guard's error, possibly wrapped by the engine
        error = error_line(exc)
    logging.getLogger("nrl_shim").removeHandler(records)
    del llm, runner
    gc.collect()
    return {
        "warnings": [m for level, m in records.messages if level in ("WARNING", "ERROR")],
        "debug": [m for level, m in records.messages if level == "DEBUG"],
        "guarded": guarded,
        "error": error,
    }


if __name__ == "__main__":
    cases = dict(arg.split("=", 1) for arg in sys.argv[1:])
    print(json.dumps({scenario: run(model_dir, scenario) for scenario, model_dir in cases.items()}))
