"""A driver with the shim and the example plugin (only on its own PYTHONPATH) and an actor whose runtime_env runs its
own interpreter (argv[1]) with neither: `python plugin_example_ray.py WORKER_PYTHON` (RAY_ADDRESS: a separately
started cluster). Prints one JSON object: what the quirk does inside the actor."""

import json
import os
import sys

import ray


@ray.remote
class Probe:
    def state(self):
        from vllm.config import CompilationConfig

        import nrl_shim
        from nrl_shim import activation, registry

        return {
            "worker_python": sys.executable,
            "active": nrl_shim.is_active(),
            "backend": CompilationConfig(use_inductor=False).backend,
            "patched": sorted(name for quirk_id, name in activation.patched() if quirk_id == "vllm-use-inductor"),
            "plugin_file": sys.modules["nrl_shim_example_quirks.vllm_use_inductor"].__file__,
            "origin": registry.origin("vllm-use-inductor"),
        }


def main(worker_python):
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    try:
        return ray.get(Probe.options(runtime_env={"py_executable": worker_python}).remote().state.remote())
    finally:
        ray.shutdown()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
