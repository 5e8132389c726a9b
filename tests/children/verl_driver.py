"""verl 0.9.1's rollout stack, unmodified, driven as its hybrid trainer drives it: a local Ray cluster (loopback, one
logical GPU) whose job-level runtime_env sets the actors' Python (`py_executable`, the worker venv without nrl-shim) and
env_vars; a trainer actor (RANK=0, RAY_LOCAL_WORLD_SIZE=1) holding verl's `ServerAdapter` per replica; verl's
`vLLMReplica.init_hybrid` starting verl's `vLLMHttpServer` actor (its own AsyncLLM, engine core in vLLM subprocesses);
refits through verl's `ServerAdapter.update_weights` (BucketedWeightSender -> the vLLM workers' BucketedWeightReceiver,
shared memory) from a transformers (torch) policy; greedy generation through `vLLMHttpServer.generate`.

Usage: verl_driver.py CASE.json RESULT.json. CASE: {"worker_python", "ray_temp_dir", "job_env", "prompts",
"max_new_tokens", "steps": [...]}; each step is one of
  {"op": "server", "model", "enforce_eager"}            start replica k (k = how many were started before)
  {"op": "probe", "server": k}                           what the server actor sees (env, Python, shim, engine config)
  {"op": "generate", "server": k}                        greedy tokens of every prompt, or the error
  {"op": "refit", "server": k, "omit": name|null, "timeout": s}   verl's refit of the policy's state_dict
  {"op": "stalled_generate", "server": k}                generate while the engine's processes are stopped (SIGSTOP)
The result (one entry per step) goes to RESULT.json after each step. Progress on stderr.

The only stand-in: `HybridWorkers` (below), the worker group `init_hybrid` takes; verl's real one is a
`RayWorkerGroup` of FSDP/Megatron workers, which need CUDA. verl reads only `.workers` from it.
"""

import asyncio
import json
import os
import signal
import sys
import time
import traceback
import uuid

import ray


def log(*parts):
    print(f"[verl_driver {time.strftime('%H:%M:%S')}]", *parts, file=sys.stderr, flush=True)


def configs(model, enforce_eager):
    """verl's own hydra `ppo_trainer` config with the rollout overrides a CPU run needs."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    overrides = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.dtype=float32",
        f"actor_rollout_ref.rollout.enforce_eager={enforce_eager}",
        "+actor_rollout_ref.rollout.enable_sleep_mode=False",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.rollout.max_model_len=256",
        "actor_rollout_ref.rollout.max_num_batched_tokens=256",
        "actor_rollout_ref.rollout.max_num_seqs=8",
        "actor_rollout_ref.rollout.prompt_length=64",
        "actor_rollout_ref.rollout.response_length=64",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=16",
    ]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model, dataclass_type=HFModelConfig)
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout), model_config


class Trainer:
    """The training side of verl's hybrid engine, reduced to what the rollout sees: per replica verl's ServerAdapter,
    and a torch policy (the checkpoint, loaded by transformers) whose state_dict is the refit."""

    def __init__(self):
        self.adapters, self.models = {}, {}

    def add(self, replica, rollout_config, model_config, model):
        from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter

        self.adapters[replica] = ServerAdapter(rollout_config, model_config, device_mesh=None, replica_rank=replica)
        self.models[replica] = model
        return os.getpid()

    async def update(self, replica, omit):
        import torch
        from transformers import AutoModelForCausalLM

        policy = AutoModelForCausalLM.from_pretrained(self.models[replica], torch_dtype=torch.float32)
        names = list(policy.state_dict())
        weights = ((name, tensor) for name, tensor in policy.state_dict().items() if name != omit)
        await self.adapters[replica].update_weights(weights, global_steps=1)
        return names


class HybridWorkers:
    """Stand-in for verl's RayWorkerGroup (see the module docstring): replica k's worker is workers[k]."""

    def __init__(self, workers):
        self.workers = workers


def probe(server):
    def look(self):
        import importlib.metadata

        engine = getattr(self, "engine", None)
        vllm_config = getattr(engine, "vllm_config", None)
        shim = sys.modules.get("nrl_shim")
        try:
            vllm_version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            vllm_version = None
        return {
            "pid": os.getpid(),
            "python": sys.executable,
            "env": {k: v for k, v in os.environ.items() if k.startswith(("NRL_", "VERL_", "VLLM_CPU"))},
            "shim_file": getattr(shim, "__file__", None),
            "load_format": str(vllm_config.load_config.load_format) if vllm_config else None,
            "enforce_eager": vllm_config.model_config.enforce_eager if vllm_config else None,
            "vllm_metadata_version": vllm_version,
        }

    return ray.get(server.__ray_call__.remote(look))


def engine_processes(server_pid):
    import psutil

    return psutil.Process(server_pid).children(recursive=True)


async def generate(server, prompts, max_new_tokens):
    async def one(prompt):
        sampling = {"temperature": 0.0, "max_tokens": max_new_tokens, "ignore_eos": True}
        return await server.generate.remote(prompt_ids=prompt, sampling_params=sampling, request_id=uuid.uuid4().hex)

    outputs = await asyncio.gather(*(one(p) for p in prompts))
    return [list(o.token_ids) for o in outputs]


def error_of(exc):
    """The innermost error's type and message (a Ray task error wraps the actor's)."""
    cause = getattr(exc, "cause", None) or exc
    return {"type": type(cause).__name__, "wrapper": type(exc).__name__, "message": str(exc)[-3000:]}


async def main(case_path, result_path):
    case = json.load(open(case_path))
    ray.init(
        num_cpus=8,
        num_gpus=1,  # one logical GPU: verl places its servers by the trainer's GPU id; nothing uses CUDA
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=case["ray_temp_dir"],
        runtime_env={"py_executable": case["worker_python"], "env_vars": case["job_env"]},
    )
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

    trainer = (
        ray.remote(Trainer)
        .options(num_gpus=1, runtime_env={"env_vars": {"RANK": "0", "RAY_LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "1"}})
        .remote()
    )
    replicas, results = [], []
    result = {"driver_python": sys.executable, "job_id": ray.get_runtime_context().get_job_id(), "steps": results}
    for step in case["steps"]:
        op, started = step["op"], time.time()
        log("step", json.dumps(step))
        out = {"op": op}
        try:
            if op == "server":
                k = len(replicas)
                rollout_config, model_config = configs(step["model"], step["enforce_eager"])
                out["trainer_pid"] = ray.get(trainer.add.remote(k, rollout_config, model_config, step["model"]))
                replica = vLLMReplica(k, rollout_config, model_config, gpus_per_node=1)
                await replica.init_hybrid(HybridWorkers([trainer] * (k + 1)))
                replicas.append(replica)
                out["server"] = k
            elif op == "probe":
                out["server"] = step["server"]
                out.update(probe(replicas[step["server"]].server_handle))
            elif op == "generate":
                server = replicas[step["server"]].server_handle
                out["tokens"] = await generate(server, case["prompts"], case["max_new_tokens"])
            elif op == "refit":
                future = trainer.update.remote(step["server"], step.get("omit"))
                try:
                    out["names"] = await asyncio.wait_for(asyncio.wrap_future(future.future()), step["timeout"])
                except asyncio.TimeoutError:
                    out["timed_out"] = True
            elif op == "stalled_generate":
                server = replicas[step["server"]].server_handle
                stopped = engine_processes(probe(server)["pid"])
                for proc in stopped:
                    proc.send_signal(signal.SIGSTOP)
                out["stopped"] = [p.pid for p in stopped]
                try:
                    out["tokens"] = await generate(server, case["prompts"][:1], case["max_new_tokens"])
                finally:
                    out["error_after_s"] = round(time.time() - started, 2)
                    for proc in stopped:
                        proc.send_signal(signal.SIGCONT)
        except Exception as exc:  # noqa: BLE001 - the test asserts on it
            out["error"] = error_of(exc)
            log("step failed:", "".join(traceback.format_exception(exc))[-2000:])
        out["seconds"] = round(time.time() - started, 2)
        results.append(out)
        log("done", json.dumps({k: v for k, v in out.items() if k != "error"})[:600])
        with open(result_path, "w") as f:
            json.dump(result, f)
    # Each engine's own shutdown (its processes and shared memory), then the cluster's.
    for replica in replicas:
        try:
            ray.get(replica.server_handle.__ray_call__.remote(lambda self: self.engine.shutdown()), timeout=30)
        except Exception as exc:  # noqa: BLE001 - a dead engine (the failed refit) has nothing left to stop
            log("engine shutdown:", type(exc).__name__)
    ray.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
