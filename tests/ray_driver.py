"""A Ray job driver, run by test_ray_workers.py as `python ray_driver.py CASE.json` (usually under `nrl-shim run`).

It connects to a separately started cluster and reports, as one JSON line, what its actors and tasks saw. Written the
way user code is: no import of nrl_shim here; whatever the shim does happens through activation alone.
"""

import json
import multiprocessing
import os
import subprocess
import sys

import ray

SPAWN_PROBE = "bool(__import__('sys').modules.get('nrl_shim') and __import__('sys').modules['nrl_shim'].is_active())"
CHILD_PROBE = "import json, sys; m = sys.modules.get('nrl_shim'); print(json.dumps(bool(m and m.is_active())))"


def shim_state():
    """What this process knows about the shim, plus whether a Python child and a spawn child activate too."""
    shim = sys.modules.get("nrl_shim")
    child = subprocess.run([sys.executable, "-c", CHILD_PROBE], capture_output=True, text=True, timeout=120)
    # The builtin eval pickles by reference; a function of this script would not (Ray ships it by value).
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        spawn_child = pool.apply(eval, (SPAWN_PROBE,))
    return {
        "python": sys.executable,
        "active": bool(shim and shim.is_active()),
        "shim_file": getattr(shim, "__file__", None),
        "child_active": child.stdout.strip() == "true",
        "child_stderr": child.stderr[-2000:],
        "spawn_child_active": spawn_child,
        "user_var": os.environ.get("USER_VAR"),
        "user_hook": os.environ.get("USER_HOOK_RAN"),
    }


@ray.remote
class Probe:
    def state(self):
        return shim_state()

    def gemma_engine(self, model_dir):
        """Build a vLLM engine the way RL frameworks do (dummy weights), and report the load format it really got
        and the shim's log lines emitted meanwhile."""
        import logging

        records = []

        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record.getMessage())

        logging.getLogger("nrl_shim").addHandler(Keep())
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # keep the engine in this actor, so we can look at it
        from vllm import LLM

        llm = LLM(
            model=model_dir,
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype="float32",
            max_model_len=128,
            enforce_eager=True,
            gpu_memory_utilization=0.2,
        )
        load_format = llm.llm_engine.vllm_config.load_config.load_format
        return {"load_format": str(getattr(load_format, "value", load_format)), "log": records}


@ray.remote
def probe_task():
    return shim_state()


def main():
    case = json.loads(open(sys.argv[1]).read())
    sys.path.insert(0, case["user_package_root"])
    ray.init(address=case["address"], log_to_driver=False, runtime_env=case.get("job_runtime_env"))
    job_env = ray.get_runtime_context().runtime_env
    user_uris = [m for m in job_env.get("py_modules") or [] if "://" in m][:1]
    worker = {"py_executable": case["worker_python"]} if case.get("worker_python") else {}
    out = {"job_env": dict(job_env)}
    for name in case["probes"]:
        if name == "actor_own_python":
            out[name] = ray.get(Probe.options(runtime_env=worker).remote().state.remote())
        elif name == "actor_own_python_and_py_modules":
            env = {**worker, "py_modules": user_uris, "env_vars": {"ACTOR_VAR": "1"}}
            out[name] = ray.get(Probe.options(runtime_env=env).remote().state.remote())
        elif name == "actor_driver_python":
            out[name] = ray.get(Probe.remote().state.remote())
        elif name == "task_own_python":
            out[name] = ray.get(probe_task.options(runtime_env=worker).remote())
        elif name == "gemma_engine":
            actor = Probe.options(runtime_env=worker).remote()
            out[name] = ray.get(actor.gemma_engine.remote(case["gemma_dir"]))
            out[name]["state"] = ray.get(actor.state.remote())
    ray.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
