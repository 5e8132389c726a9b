"""A chunked refit that loses one bucket, on a real engine (vLLM's CPU build) whose engine core and worker run in
their own processes, as in production; for test_reliability_engines.py:
`python reliability_refit_buckets.py MODEL_DIR BUCKET_BYTES DROPPED_NAME`. Prints one JSON line.

The refit is what RL frameworks do through vLLM's collective_rpc: the trainer's state_dict, in model order, cut into
buckets of at most BUCKET_BYTES, each sent by one call that ends in vLLM's in-place `reload_weights` in the worker
process; the bucket holding DROPPED_NAME never arrives. Then the engine generates twice. The worker's `nrl_shim` and
`vllm` log records are collected there (a handler on the worker object) and returned over collective_rpc.
Needs VLLM_ALLOW_INSECURE_SERIALIZATION=1 (callables sent to the worker, as NeMo RL's worker extensions are).
"""

import json
import logging
import re
import sys

ENGINE_KW = dict(
    skip_tokenizer_init=True, dtype="float32", max_model_len=128, enforce_eager=True, gpu_memory_utilization=0.05
)


def model_order(name):
    """The order a trainer's state_dict walks a causal LM: embeddings, layers by index, final norm, head."""
    found = re.match(r"model\.layers\.(\d+)\.", name)
    if name.startswith("model.embed_tokens"):
        return (0, 0, name)
    if found:
        return (1, int(found.group(1)), name)
    return (2 if name.startswith("model.norm") else 3, 0, name)


def plan_buckets(model_dir, bucket_bytes):
    import math

    from safetensors import safe_open

    with safe_open(f"{model_dir}/model.safetensors", "pt") as f:
        sizes = {name: 4 * math.prod(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 (safe_open: no __iter__)
    buckets, current, used = [], [], 0
    for name in sorted(sizes, key=model_order):
        if current and used + sizes[name] > bucket_bytes:
            buckets.append(current)
            current, used = [], 0
        current.append(name)
        used += sizes[name]
    buckets.append(current)
    return buckets


# ------------------------------------------------------------------ run in the worker process (self: the worker)


def _install_recorder(self):
    class Keep(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.records = []

        def emit(self, record):
            self.records.append((record.name, record.levelname, record.getMessage()))

    keep = Keep()
    logging.getLogger("nrl_shim").addHandler(keep)
    logging.getLogger("vllm").addHandler(keep)
    self._reliability_records = keep.records
    guard = getattr(self.model_runner.model, "_nrl_shim_refit_guard", None)
    return sorted(guard.fingerprints) if guard is not None else None


def _reload_bucket(self, model_dir, names):
    from safetensors import safe_open

    with safe_open(f"{model_dir}/model.safetensors", "pt") as f:
        items = [(name, f.get_tensor(name)) for name in names]
    self.model_runner.reload_weights(weights_iterator=iter(items))
    return len(items)


def _records(self):
    return list(self._reliability_records)


# ------------------------------------------------------------------


def main(model_dir, bucket_bytes, dropped_name):
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, load_format="dummy", **ENGINE_KW)
    (guarded,) = llm.collective_rpc(_install_recorder)
    buckets = plan_buckets(model_dir, bucket_bytes)
    dropped = next(i for i, bucket in enumerate(buckets) if dropped_name in bucket)
    for i, bucket in enumerate(buckets):
        if i != dropped:
            llm.collective_rpc(_reload_bucket, args=(model_dir, bucket))
    params = SamplingParams(temperature=0, max_tokens=4, detokenize=False)
    error = None
    try:
        for _ in range(2):  # the second generation must not report again
            llm.generate([{"prompt_token_ids": [5, 17, 42]}], params, use_tqdm=False)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    (records,) = llm.collective_rpc(_records)
    return {
        "buckets": buckets,
        "dropped": dropped,
        "guarded": guarded,
        "shim_warnings": [m for logger, level, m in records if logger == "nrl_shim" and level == "WARNING"],
        "shim_debug": [m for logger, level, m in records if logger == "nrl_shim" and level == "DEBUG"],
        "vllm_not_loaded_warnings": [m for logger, level, m in records if "were not loaded" in m],
        "error": error,
    }


if __name__ == "__main__":  # the engine core is spawned and re-imports this module
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), sys.argv[3])))
