"""Replica engines and their seeds (vLLM's CPU build), for test_vllm_replica_seed.py:
`python replica_seed_engine.py MODEL_DIR CASES.json`. Per case, an in-process `LLM` (keyword arguments from the case)
given 8 copies of one prompt at temperature 1.0 (n=1 each, no per-request seed, as a GRPO group spread over replicas):
the 8 completions' token ids and the seed in the engine's config.
Prints one JSON line: {"cases": {name: {"samples", "seed"}}, "log": [[level, message], ...]}.
"""

import gc
import json
import logging
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: its config is reachable
PROMPT = [5, 17, 42]


def engine_case(directory, kwargs):
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=directory, skip_tokenizer_init=True, dtype="float32", max_model_len=64, enforce_eager=True, **kwargs
    )
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": PROMPT}] * 8, params, use_tqdm=False)
    result = {
        "samples": [list(output.outputs[0].token_ids) for output in outputs],
        "seed": llm.llm_engine.vllm_config.model_config.seed,
    }
    del llm
    gc.collect()
    return result


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from log_records import Records

    records = Records()
    logging.getLogger("nrl_shim").addHandler(records)
    directory, cases = sys.argv[1], json.loads(sys.argv[2])
    results = {name: engine_case(directory, case.get("kwargs", {})) for name, case in cases.items()}
    print(json.dumps({"cases": results, "log": records.messages}))
