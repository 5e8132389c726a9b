"""A NeMo RL HEAD (7ea279abf) job driver, for test_nemo_rl_head.py: `python nemo_rl_head_driver.py CASE.json OUT.json`.

NeMo RL's own code, unmodified, as its GRPO setup uses it: `init_ray()` joins the cluster named by RAY_ADDRESS (and
hands the job `runtime_env={"env_vars": dict(os.environ)}`); a `RayVirtualCluster` with one GPU bundle; then twice
`VllmGeneration` (-> `RayWorkerGroup` -> `RayWorkerBuilder` -> its worker actor), first with the sync engine
(`VllmGenerationWorker`, `vllm.LLM`), then with the async one (`VllmAsyncGenerationWorker`, `AsyncLLM`), each from a
generation config completed by NeMo RL's `configure_generation_config(..., is_eval=False)`, which sets
`load_format="dummy"` as in training. The sync engine generates with NeMo RL's `generate(greedy=True)`; the async one
with NeMo RL's `generate_async(greedy=True)`, one sample per call as NeMo RL's rollouts do, each outcome recorded
(tokens, or the exception NeMo RL raised, with its chain).

What is the harness's, not NeMo RL's:
- The worker venv: NeMo RL maps each worker class to a venv it builds from its lock
  (`ACTOR_ENVIRONMENT_REGISTRY[fqn] = PY_EXECUTABLES.VLLM`, `uv run --locked --extra vllm`); the driver points both
  vLLM worker classes at the case's `worker_python` (a venv with vLLM and Ray, without nrl-shim).
- `VllmGeneration._post_init` / `_report_device_id` are skipped (CUDA only: NUMA binding of vLLM's workers, CUDA
  device UUIDs); nothing of this test uses their results.
- Engine settings a CPU needs, through NeMo RL's config: `precision="float32"`, `enable_prefix_caching=False`,
  a small `gpu_memory_utilization` (on CPU a fraction of host memory). Stubs (two for the CPU, one for a conflict
  between NeMo RL HEAD's worker extension and vLLM >= 0.29's worker class: tests/nemo_rl_head_stubs/sitecustomize.py)
  come through PYTHONPATH, which NeMo RL forwards.
- The tokenizer: NeMo RL's `get_tokenizer` is `AutoTokenizer.from_pretrained` plus `pad_token = eos_token`; the driver
  does those two lines itself (its module imports NeMo RL's datasets).

No import of nrl_shim: under the shim, activation comes from the environment (`nrl-shim run`), as in a job.
"""

import asyncio
import json
import os
import sys
import time


def log(message):
    print(f"[nemo_rl_head_driver {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def inspect_actor(worker):
    """Runs in the actor (`worker` is NeMo RL's worker): what the engine was built with, the actor's environment,
    and whether nrl-shim is there."""
    import os
    import sys

    llm = worker.llm
    vllm_config = getattr(llm, "vllm_config", None) or llm.llm_engine.vllm_config
    load_format = vllm_config.load_config.load_format
    shim = sys.modules.get("nrl_shim")
    activation = sys.modules.get("nrl_shim.activation")
    return {
        "pid": os.getpid(),
        "python": sys.executable,
        "engine": type(llm).__module__ + "." + type(llm).__qualname__,
        "load_format": str(getattr(load_format, "value", load_format)),
        "dtype": str(vllm_config.model_config.dtype),
        "environ": dict(os.environ),
        "shim_active": bool(shim and shim.is_active()),
        "shim_file": getattr(shim, "__file__", None),
        "shim_patched": [list(p) for p in activation.patched()] if activation else [],
    }


def batch(config, prompts):
    import torch
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), config["_pad_token_id"], dtype=torch.long)
    for i, prompt in enumerate(prompts):
        input_ids[i, : len(prompt)] = torch.tensor(prompt)
    return BatchedDataDict({"input_ids": input_ids, "input_lengths": torch.tensor([len(p) for p in prompts])})


def generated(result, i, prompt_length):
    length = int(result["generation_lengths"][i])
    return result["output_ids"][i, prompt_length : prompt_length + length].tolist()


def exception_chain(error):
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append({"type": type(error).__module__ + "." + type(error).__qualname__, "message": str(error)})
        error = error.__cause__ or error.__context__
    return chain


async def generate_each(generation, config, prompts):
    """NeMo RL's rollouts: one `generate_async` per sample; each outcome (tokens or NeMo RL's exception)."""
    outcomes = []
    for prompt in prompts:
        started = time.monotonic()
        try:
            results = [item async for item in generation.generate_async(batch(config, [prompt]), greedy=True)]
            ((_, result),) = results
            outcomes.append({"tokens": generated(result, 0, len(prompt))})
        except Exception as error:  # what NeMo RL raised to its caller, recorded as it is
            outcomes.append({"error": exception_chain(error)})
        outcomes[-1]["seconds"] = round(time.monotonic() - started, 3)
    return outcomes


def main():
    case = json.loads(open(sys.argv[1]).read())
    from nemo_rl.distributed import ray_actor_environment_registry as registry

    for fqn in (
        "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker",
        "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorker",
    ):
        registry.ACTOR_ENVIRONMENT_REGISTRY[fqn] = case["worker_python"]

    import ray
    from nemo_rl.distributed.virtual_cluster import RayVirtualCluster, init_ray
    from nemo_rl.models.generation import configure_generation_config
    from nemo_rl.models.generation.vllm import VllmGeneration
    from transformers import AutoTokenizer

    VllmGeneration._post_init = lambda self: None
    VllmGeneration._report_device_id = lambda self: None

    tokenizer = AutoTokenizer.from_pretrained(case["model"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    def generation_config(async_engine):
        config = {
            "backend": "vllm",
            "model_name": case["model"],
            "max_new_tokens": case["max_new_tokens"],
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": None,
            "val_temperature": 1.0,
            "val_top_p": 1.0,
            "val_top_k": None,
            "stop_token_ids": None,
            "stop_strings": None,
            "colocated": {"enabled": True, "resources": {"gpus_per_node": None, "num_nodes": None}},
            "vllm_cfg": {
                "tensor_parallel_size": 1,
                "pipeline_parallel_size": 1,
                "expert_parallel_size": 1,
                "gpu_memory_utilization": 0.1,
                "max_model_len": 128,
                "skip_tokenizer_init": False,
                "async_engine": async_engine,
                "precision": "float32",
                "kv_cache_dtype": "auto",
                "enforce_eager": True,
                "enable_prefix_caching": False,
            },
        }
        if not async_engine:  # NeMo RL's key, set in one worker's config and not the other's: the shim idle / acting
            config["vllm_cfg"]["logprobs_mode"] = "processed_logprobs"
        return configure_generation_config(config, tokenizer, is_eval=False)

    log("init_ray")
    init_ray()
    out = {"driver_python": sys.executable, "driver_environ": dict(os.environ)}
    cluster = RayVirtualCluster(
        bundle_ct_per_node_list=[1], use_gpus=True, num_gpus_per_node=1, max_colocated_worker_groups=1, name="head"
    )
    try:
        for name in ("sync", "async"):
            config = generation_config(async_engine=name == "async")
            out[name] = part = {"load_format_asked": config["vllm_cfg"]["load_format"]}
            log(f"{name}: starting NeMo RL's VllmGeneration (its worker actor and engine)")
            started = time.monotonic()
            generation = VllmGeneration(cluster=cluster, config=config, name_prefix=f"vllm_{name}")
            part["start_seconds"] = round(time.monotonic() - started, 1)
            try:
                (worker,) = generation.worker_group.workers
                part["actor"] = ray.get(worker.__ray_call__.remote(inspect_actor))
                log(f"{name}: engine up in {part['start_seconds']} s; generating")
                prompts = case["prompts"]
                if name == "sync":
                    result = generation.generate(batch(config, prompts), greedy=True)
                    part["outcomes"] = [{"tokens": generated(result, i, len(p))} for i, p in enumerate(prompts)]
                else:
                    part["outcomes"] = asyncio.run(generate_each(generation, config, prompts))
                log(f"{name}: {part['outcomes']}")
            finally:
                part["shutdown"] = generation.shutdown()
    finally:
        cluster.shutdown()
        ray.shutdown()
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    log("done")


if __name__ == "__main__":
    main()
