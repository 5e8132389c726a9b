"""A NeMo RL (f963d9b1b) job driver, for test_nemo_rl_f963.py: `python nemo_rl_f963_driver.py CASE.json OUT.json`.

NeMo RL's own code, unmodified, as its GRPO setup and refit use it: `init_ray()` joins the cluster named by
RAY_ADDRESS; a `RayVirtualCluster` with one GPU bundle; `VllmGeneration` (-> `RayWorkerGroup` -> `RayWorkerBuilder`
-> its `VllmGenerationWorker` actor) from a generation config that `configure_generation_config` completes, with
`load_format="dummy"` as NeMo RL's training configs set it; then `refit_policy_generation`'s sequence (sleep after
setup, wake the weights, refit, wake the KV cache), its `generate(greedy=True)`, and its shutdown.

What is the harness's, not NeMo RL's:
- The worker venv: NeMo RL binds `VllmGenerationWorker.DEFAULT_PY_EXECUTABLE` to `PY_EXECUTABLES.VLLM` (`uv run
  --locked --extra vllm`, a venv it builds from its lock) when the class is defined; the driver sets that constant to
  the case's `worker_python` (a venv with vLLM and Ray, without nrl-shim) before importing the class.
- The refit transport: NeMo RL's refit is CUDA IPC (`update_weights_from_ipc_handles`), which needs a GPU. Its vLLM
  worker extension ends it with `self.model_runner.model.load_weights(weights=weights)` inside vLLM's worker, reached
  through `llm.collective_rpc`. The driver makes that same call, through the same `collective_rpc` of the actor's
  `self.llm`, with the checkpoint's tensors handed over by Ray (Ray's built-in `__ray_call__`, which every actor has).
- The tokenizer: NeMo RL's `get_tokenizer` is `AutoTokenizer.from_pretrained` plus `pad_token = eos_token`; its module
  (`nemo_rl.algorithms.utils`) also imports NeMo RL's datasets, which need packages this test doesn't, so the driver
  does those two lines itself.
- CPU stubs for vLLM (tests/nemo_rl_stubs/sitecustomize.py) come through PYTHONPATH, which NeMo RL forwards.

No import of nrl_shim: under the shim, activation comes from the environment (`nrl-shim run`), as in a job.
"""

import json
import os
import sys


def refit(worker, weights):
    """Runs in the actor (`worker` is NeMo RL's VllmGenerationWorker): the last call of NeMo RL's
    VllmInternalWorkerExtension.update_weights_from_ipc_handles, through the worker's own llm.collective_rpc."""

    def load_weights(vllm_worker, weights):
        vllm_worker.model_runner.model.load_weights(weights=weights)
        return True

    return worker.llm.collective_rpc(load_weights, args=(weights,))


def inspect_engine(worker):
    """Runs in the actor: what the engine was built with and what its model holds after the refit."""
    import sys

    def normalizer(vllm_worker):
        value = getattr(vllm_worker.model_runner.model.model, "normalizer", None)
        return None if value is None else float(value)

    load_format = worker.llm.llm_engine.vllm_config.load_config.load_format
    shim = sys.modules.get("nrl_shim")
    return {
        "pid": os.getpid(),
        "python": sys.executable,
        "engine": type(worker.llm.llm_engine).__module__,
        "load_format": str(getattr(load_format, "value", load_format)),
        "dtype": str(worker.llm.llm_engine.vllm_config.model_config.dtype),
        "normalizer": worker.llm.collective_rpc(normalizer)[0],
        "shim_active": bool(shim and shim.is_active()),
        "shim_file": getattr(shim, "__file__", None),
        "nrl_shim_env": os.environ.get("NRL_SHIM"),
    }


def main():
    case = json.loads(open(sys.argv[1]).read())
    # NeMo RL's vLLM workers run PY_EXECUTABLES.VLLM, bound to the worker class when it is defined: point it at the
    # worker venv first (see the module docstring).
    from nemo_rl.distributed import virtual_cluster

    virtual_cluster.PY_EXECUTABLES.VLLM = case["worker_python"]

    import ray
    import torch
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl.distributed.virtual_cluster import RayVirtualCluster, init_ray
    from nemo_rl.models.generation.interfaces import configure_generation_config
    from nemo_rl.models.generation.vllm import VllmGeneration
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(case["model"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = {
        "backend": "vllm",
        "model_name": case["model"],
        "max_new_tokens": case["max_new_tokens"],
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": None,
        "stop_token_ids": None,
        "stop_strings": None,
        "vllm_cfg": {
            "tensor_parallel_size": 1,
            "gpu_memory_utilization": 0.1,
            "max_model_len": 128,
            "load_format": "dummy",  # as NeMo RL's training configs set it; eval would set "auto"
        },
    }
    config = configure_generation_config(config, tokenizer, is_eval=False)

    init_ray()
    out = {"driver_python": sys.executable, "config": {k: v for k, v in config.items() if k != "vllm_cfg"}}
    out["vllm_cfg"] = config["vllm_cfg"]
    cluster = RayVirtualCluster(
        bundle_ct_per_node_list=[1], use_gpus=True, num_gpus_per_node=1, max_colocated_worker_groups=1, name="f963"
    )
    generation = VllmGeneration(cluster=cluster, config=config)
    try:
        (worker,) = generation.worker_group.workers
        # grpo.setup: put the fresh engine to sleep; refit_policy_generation: wake the weights, refit, wake the cache.
        out["finish_generation"] = generation.finish_generation()
        out["wake_weights"] = generation.prepare_for_generation(tags=["weights"])
        weights = list(load_file(os.path.join(case["model"], "model.safetensors")).items())
        out["refit"] = ray.get(worker.__ray_call__.remote(refit, weights))
        out["wake_kv_cache"] = generation.prepare_for_generation(tags=["kv_cache"])
        out["actor"] = ray.get(worker.__ray_call__.remote(inspect_engine))

        prompts = case["prompts"]
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), config["pad_token_id"], dtype=torch.long)
        for i, prompt in enumerate(prompts):
            input_ids[i, : len(prompt)] = torch.tensor(prompt)
        data = BatchedDataDict({"input_ids": input_ids, "input_lengths": torch.tensor([len(p) for p in prompts])})
        result = generation.generate(data, greedy=True)
        out["tokens"], out["logprobs"] = [], []
        for i, prompt in enumerate(prompts):
            start, length = len(prompt), int(result["generation_lengths"][i])
            out["tokens"].append(result["output_ids"][i, start : start + length].tolist())
            out["logprobs"].append(result["logprobs"][i, start : start + length].tolist())
        out["finish_generation_after"] = generation.finish_generation()
    finally:
        out["shutdown"] = generation.shutdown()
        cluster.shutdown()
        ray.shutdown()
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
