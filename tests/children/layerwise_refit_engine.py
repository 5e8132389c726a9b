"""Refits of real vLLM engines (CPU build) whose layers vLLM re-lays out after loading (fused-MoE experts; packed
linear layers of an engine loaded with real weights), for test_vllm_layerwise_refit.py:
`python layerwise_refit_engine.py CASES.json`. Each case gets a fresh engine; per listed refit: refit (an error is
recorded, not raised), then, unless the refit says `"generate": false` (the next refit follows at once), greedy tokens
and the logprob vLLM returned for each. The shim is on or off as the
environment the test gives this process says, as in a job.
Prints one JSON line: {"cases": {name: {...}}, "log": [[level, message], ...]} (the `nrl_shim` records).
"""

import gc
import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for tiny_models
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: the model is reachable

ENGINE_KW = dict(skip_tokenizer_init=True, max_model_len=128, enforce_eager=True, kv_cache_memory_bytes=64 << 20)


def rows_off():
    """The shim's fix as it was before it covered refits in a row: vLLM's layerwise reload left to process each layer
    once per bracket (its hooks into vLLM's reload module taken off)."""
    import vllm.model_executor.model_loader.reload.layerwise as layerwise

    from nrl_shim.patching import unwrap
    from nrl_shim.quirks.vllm.refit import layerwise_refit as quirk

    for hook in quirk._ROW_HOOKS:
        unwrap(layerwise, hook, quirk.ID)
    quirk._ROWS["ready"] = False


def engine_case(case):
    from vllm import LLM, SamplingParams

    from tiny_models import state_dict_items

    if case.get("rows_off"):
        rows_off()

    # No prefix caching: every refit's prompts are computed anew (the stale cache is vllm-prefix-cache-refit's).
    llm = LLM(
        model=case["model"],
        load_format=case["load_format"],
        dtype=case["dtype"],
        enable_prefix_caching=False,
        **ENGINE_KW,
    )
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    params = SamplingParams(temperature=0, max_tokens=case["max_tokens"], ignore_eos=True, detokenize=False, logprobs=0)

    def generate():
        outputs = llm.generate([{"prompt_token_ids": p} for p in case["prompts"]], params, use_tqdm=False)
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        logprobs = [
            [step[token].logprob for step, token in zip(o.outputs[0].logprobs, ids)] for o, ids in zip(outputs, tokens)
        ]
        return {"tokens": tokens, "logprobs": logprobs}

    model = runner.model
    out = {"refits": []}
    for refit in case["refits"]:
        items = state_dict_items(refit["model"])
        error = None
        try:
            if refit["via"] == "reload_weights":  # vLLM's own bracketed refit
                runner.reload_weights(weights_iterator=iter(items))
            elif refit["via"] == "per_tensor":  # TRL's colocate refit: one tensor per call
                for item in items:
                    model.load_weights([item])
            elif refit["via"] == "twice":  # a tensor sent twice: before and after its layer's other tensors arrived
                experts = [item for item in items if ".experts." in item[0]] or items
                model.load_weights([experts[0], *items, experts[1]])
            elif refit["via"] == "resend":  # the whole state dict, then one expert tensor again with other values
                other = next(item for item in state_dict_items(refit["resend"]) if ".experts." in item[0])
                model.load_weights(items)
                model.load_weights([other])
            else:  # the whole state dict in one call (NeMo RL, a user's loop)
                model.load_weights(items)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        if not refit.get("generate", True):  # the next refit follows at once (no rollout between)
            out["refits"].append({"error": error, "model": refit["model"], "tokens": None, "logprobs": None})
            continue
        try:
            result = generate()
        except Exception as exc:
            result = {"tokens": None, "logprobs": None, "generate_error": f"{type(exc).__name__}: {exc}"}
        out["refits"].append({"error": error, "model": refit["model"], **result})
    return out


if __name__ == "__main__":
    from log_records import Records  # next to this file (the script's directory is on sys.path)

    records = Records()
    logging.getLogger("nrl_shim").addHandler(records)
    cases = json.loads(sys.argv[1])
    results = {}
    for case in cases:
        results[case["name"]] = engine_case(case)
        gc.collect()
    print(json.dumps({"cases": results, "log": records.messages}))
