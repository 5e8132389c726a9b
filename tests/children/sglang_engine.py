"""One real SGLang engine (`sglang.Engine`, CPU) serving a list of cases in order, for tests/test_sglang_engine.py:
`python sglang_engine.py RUN.json`, RUN = {"engine": Engine's keyword arguments, "cases": [...]}. The test starts it
with tests/sglang_cpu on PYTHONPATH and SGLANG_USE_CPU_ENGINE=1 (tests/sglang_cpu/README.md); the shim is on or off
as that environment says, as in a job.

Cases, each on the engine as the cases before it left it (its radix cache included):
- {"kind": "generate", "prompt": ids, "max_tokens": n}: greedy tokens, their logprobs, the prompt tokens served from
  the radix cache;
- {"kind": "update_from_tensor", "checkpoint": dir, "flush_cache": bool}: the checkpoint's tensors through
  `Engine.update_weights_from_tensor` (inside begin_weight_update()/end_weight_update() where the release has them:
  0.5.21+ refuses an update outside that session), as NeMo RL's and slime's refits send each bucket;
  With "only": a list of parameter names, those tensors only; with "dtype" (e.g. "bfloat16"), cast to it;
- {"kind": "update_from_disk", "checkpoint": dir}: `Engine.update_weights_from_disk(dir)` (verl's and AReaL's disk
  route; a checkpoint reloaded);
- {"kind": "flush_cache", "retry_s": s}: `Engine.flush_cache()`, retried while refused, up to s seconds;
- {"kind": "weights", "names": [...]}: `Engine.get_weights_by_name(name)` of each (its first rows), as float lists:
  what the engine holds after its post-processing (an FP8 layer's FP8 weight); None where SGLang cannot read it.
Prints one JSON line: whether the shim is active here, the engine's start time and the `nrl_shim` records of this
process during it, and per case its result, its time and those records.
"""

import json
import logging
import os
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)  # tiny_models, log_records


def generate(engine, case):
    out = engine.generate(
        input_ids=case["prompt"],
        sampling_params={"temperature": 0.0, "max_new_tokens": case["max_tokens"], "ignore_eos": True},
        return_logprob=True,
    )
    meta = out["meta_info"]
    entries = meta["output_token_logprobs"]  # (logprob, token id, text) per generated token
    return {
        "tokens": [int(entry[1]) for entry in entries],
        "logprobs": [float(entry[0]) for entry in entries],
        "cached": int(meta.get("cached_tokens") or 0),
    }


def update_from_tensor(engine, case):
    import torch

    from tiny_models import state_dict_items

    named = state_dict_items(case["checkpoint"])
    if case.get("only"):
        named = [(name, tensor) for name, tensor in named if name in case["only"]]
    if case.get("dtype"):
        named = [(name, tensor.to(getattr(torch, case["dtype"]))) for name, tensor in named]
    session = hasattr(engine, "begin_weight_update")  # 0.5.21+ (sglang PR #28001)
    results = {}
    if session:
        results["begin"] = list(engine.begin_weight_update())
    results["update"] = list(engine.update_weights_from_tensor(named, flush_cache=case["flush_cache"]))
    if session:
        results["end"] = list(engine.end_weight_update())
    return results


def update_from_disk(engine, case):
    return {"update": list(engine.update_weights_from_disk(case["checkpoint"]))}


def flush_cache(engine, case):
    """Retried each second up to `retry_s`, as NeMo RL retries its flush: a flush right after a request finished can be
    refused while the scheduler still holds that request (seen on 0.5.12.post1)."""
    deadline, attempts = time.monotonic() + case.get("retry_s", 0), []
    while True:
        result = engine.flush_cache()
        attempts.append(bool(getattr(result, "success", result)))
        if attempts[-1] or time.monotonic() >= deadline:
            return {"success": attempts[-1], "attempts": attempts}
        time.sleep(1)


def weights(engine, case):
    import torch

    out = {}
    for name in case["names"]:
        value = engine.get_weights_by_name(name)
        out[name] = torch.as_tensor(value).float().flatten().tolist() if value is not None else None
    return out


CASES = {
    "generate": generate,
    "update_from_tensor": update_from_tensor,
    "update_from_disk": update_from_disk,
    "flush_cache": flush_cache,
    "weights": weights,
}


def main():
    from log_records import Records  # tests/children, the script's own directory

    records = Records()
    logging.getLogger("nrl_shim").addHandler(records)
    with open(sys.argv[1]) as f:
        run = json.load(f)
    started = time.monotonic()
    import sglang

    engine = sglang.Engine(**run["engine"])
    start_s = time.monotonic() - started
    start_log = list(records.messages)
    results = []
    try:
        for case in run["cases"]:
            first, t0 = len(records.messages), time.monotonic()
            result = CASES[case["kind"]](engine, case)
            results.append({"result": result, "seconds": time.monotonic() - t0, "log": records.messages[first:]})
    finally:
        engine.shutdown()
    import nrl_shim

    summary = {"sglang": sglang.__version__, "shim_active": nrl_shim.is_active(), "engine_start_s": start_s}
    print(json.dumps({**summary, "start_log": start_log, "cases": results}), flush=True)


if __name__ == "__main__":  # the engine's scheduler and detokenizer are spawned: they import this file again
    main()
