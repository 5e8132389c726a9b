"""A Ray job driver for test_reliability_ray.py, run under `nrl-shim run` as `python reliability_ray_driver.py
CASE.json`. Written as user code is: no import of nrl_shim; what the shim does arrives through activation and Ray.
Prints one JSON line.

Scenarios (CASE["scenario"]):
  actor_restart  an engine actor (its own venv as py_executable, max_restarts=1) builds a vLLM engine for a tiny
                 Gemma-3 with load_format="dummy" and rolls out; its process is killed (SIGKILL) mid-rollout; the
                 driver records Ray's error, then the restarted actor's state (new process, shim, Gemma fix, log).
  second_node    an actor (its own venv) placed by a custom resource on the cluster's second node; reports where it
                 runs, whether the shim is active there, and the engine config vLLM builds there for the same Gemma.
  job_report     what `nrl-shim report` gathers: an actor on the second node (its own venv, its records in a directory
                 of that node's own, CASE["node_dir"]) refits an in-process engine between two rollouts of a shared
                 prompt; the driver's own engine (its engine core a process of its own) does the same through
                 collective_rpc; two children import vLLM, one with the shim off (NRL_SHIM=0). Prints their pids.
"""

import json
import os
import signal
import sys
import time

import ray

ENGINE_KW = dict(
    skip_tokenizer_init=True, dtype="float32", max_model_len=128, enforce_eager=True, gpu_memory_utilization=0.05
)


def _keep_shim_log():
    import logging

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("nrl_shim").addHandler(Keep(logging.DEBUG))
    return records


def _process_state():
    shim = sys.modules.get("nrl_shim")
    context = ray.get_runtime_context()
    return {
        "pid": os.getpid(),
        "python": sys.executable,
        "node_id": context.get_node_id(),
        "reconstructed": context.was_current_actor_reconstructed,
        "active": bool(shim and shim.is_active()),
        "shim_file": getattr(shim, "__file__", None),
    }


@ray.remote(max_restarts=1, max_task_retries=0)
class EngineActor:
    def __init__(self, model_dir):
        self.log = _keep_shim_log()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine inside this actor: killing it kills the engine
        from vllm import LLM

        self.llm = LLM(model=model_dir, load_format="dummy", **ENGINE_KW)

    def state(self):
        load_format = self.llm.llm_engine.vllm_config.load_config.load_format
        return {**_process_state(), "load_format": str(getattr(load_format, "value", load_format)), "log": self.log}

    def rollout(self, marker=None, seconds=0.0):
        """Greedy rollouts until `seconds` passed (at least one batch); `marker` is written after the first batch."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, detokenize=False)
        prompts = [{"prompt_token_ids": [5 + i, 17, 42]} for i in range(8)]
        end, batches = time.monotonic() + seconds, 0
        while True:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
            batches += 1
            if marker and batches == 1:
                with open(marker, "w") as f:
                    f.write(str(os.getpid()))
            if time.monotonic() >= end:
                return {"batches": batches, "tokens": [len(o.outputs[0].token_ids) for o in outputs]}


@ray.remote
class Probe:
    def state(self):
        return _process_state()

    def gemma_config(self, model_dir):
        """The engine config vLLM builds here for a Gemma with load_format="dummy", and the shim's log meanwhile."""
        log = _keep_shim_log()
        from vllm.engine.arg_utils import EngineArgs

        config = EngineArgs(model=model_dir, load_format="dummy", **ENGINE_KW).create_engine_config()
        load_format = config.load_config.load_format
        return {"load_format": str(getattr(load_format, "value", load_format)), "log": log}


def actor_restart(case):
    worker = {"py_executable": case["worker_python"]}
    actor = EngineActor.options(runtime_env=worker).remote(case["gemma_dir"])
    first = ray.get(actor.state.remote(), timeout=900)
    marker = os.path.join(case["tmp"], "rollout-started")
    rollout = actor.rollout.remote(marker, 600.0)
    deadline = time.monotonic() + 300
    while not os.path.exists(marker):
        if time.monotonic() > deadline:
            raise TimeoutError("the rollout never started")
        time.sleep(0.05)
    killed_at = time.monotonic()
    os.kill(first["pid"], signal.SIGKILL)
    try:
        result = ray.get(rollout, timeout=300)
        error = {"type": None, "result": result}
    except Exception as exc:  # Ray's error for the call in flight: recorded, the test judges it
        error = {
            "type": f"{type(exc).__module__}.{type(exc).__name__}",
            "is_ray_actor_error": isinstance(exc, ray.exceptions.RayActorError),
            "message": str(exc)[:600],
        }
    error["after_s"] = round(time.monotonic() - killed_at, 2)
    # While Ray restarts it, calls fail fast with ActorUnavailableError: a driver waits and asks again.
    unavailable, deadline = 0, time.monotonic() + 900
    while True:
        try:
            second = ray.get(actor.state.remote(), timeout=900)
            break
        except ray.exceptions.ActorUnavailableError:
            unavailable += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
    second["restarted_after_s"] = round(time.monotonic() - killed_at, 1)
    second["unavailable_answers"] = unavailable
    rolled = ray.get(actor.rollout.remote(), timeout=300)
    return {"first": first, "error": error, "second": second, "second_rollout": rolled}


def second_node(case):
    nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    target = [node_id for node_id, n in nodes.items() if case["node_resource"] in n["Resources"]]
    probe = Probe.options(
        runtime_env={"py_executable": case["worker_python"]}, resources={case["node_resource"]: 1}, num_cpus=0
    ).remote()
    state = ray.get(probe.state.remote(), timeout=600)
    engine = ray.get(probe.gemma_config.remote(case["gemma_dir"]), timeout=600)
    return {
        "nodes": len(nodes),
        "driver_node": ray.get_runtime_context().get_node_id(),
        "resource_node": target,
        "state": state,
        "engine": engine,
    }


PROMPT = [(i * 37) % 500 + 3 for i in range(300)]  # longer than two KV blocks: a prefix the cache keeps


def _refit(model, path):
    from safetensors.torch import load_file

    model.load_weights(list(load_file(os.path.join(path, "model.safetensors")).items()))


def _two_rollouts(llm, refit, checkpoints):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, detokenize=False)
    cached = []
    for path in checkpoints:
        refit(path)
        cached.append(llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].num_cached_tokens)
    return cached


LLAMA_KW = dict(ENGINE_KW, max_model_len=512, enable_prefix_caching=True)


@ray.remote
class RefitActor:
    def run(self, checkpoints):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this actor
        from vllm import LLM

        llm = LLM(model=checkpoints[0], load_format="dummy", **LLAMA_KW)
        model = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model
        cached = _two_rollouts(llm, lambda path: _refit(model, path), checkpoints)
        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(), "cached": cached}


def job_report(case):
    import subprocess

    nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    runtime_env = {"py_executable": case["worker_python"], "env_vars": {"NRL_SHIM_REPORT_DIR": case["node_dir"]}}
    actor = RefitActor.options(runtime_env=runtime_env, resources={case["node_resource"]: 1}, num_cpus=0).remote()
    on_node = ray.get(actor.run.remote(case["checkpoints"]), timeout=900)
    ray.kill(actor)
    # The driver's engine: its engine core and worker in processes of their own; the refit through collective_rpc,
    # with a function the worker imports (tests/prefix_cache_refit.py).
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    sys.path.insert(0, tests)
    from prefix_cache_refit import refit_worker
    from vllm import LLM

    engine = LLM(model=case["checkpoints"][0], load_format="dummy", **LLAMA_KW)
    cached = _two_rollouts(engine, lambda path: engine.collective_rpc(refit_worker, args=(path,)), case["checkpoints"])
    children = {}
    for name, shim in (("shim_on", "1"), ("shim_off", "0")):
        # Engine arguments as a framework builds them: the sampling fixes log their change where it is active.
        code = "import os, sys; from vllm.engine.arg_utils import EngineArgs; EngineArgs(model=sys.argv[1]); print(os.getpid())"
        proc = subprocess.run(
            [sys.executable, "-c", code, case["checkpoints"][0]],
            env=dict(os.environ, NRL_SHIM=shim),
            capture_output=True,
            text=True,
        )
        children[name] = int(proc.stdout.split()[-1])
    return {
        "nodes": len(nodes),
        "driver_pid": os.getpid(),
        "driver_cached": cached,
        "on_node": on_node,
        "children": children,
    }


def main():
    case = json.loads(open(sys.argv[1]).read())
    ray.init(address=case["address"], log_to_driver=False)
    out = {"actor_restart": actor_restart, "second_node": second_node, "job_report": job_report}[case["scenario"]](case)
    ray.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
