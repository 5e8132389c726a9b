"""Run with NRL_SHIM=1: the driver joins the Ray cluster at argv[1] with a user runtime_env; an actor reports on
itself and on the variables it got."""

import json
import sys

import ray
from propagation_report import report

ray.init(address=sys.argv[1], log_to_driver=False, runtime_env={"env_vars": {"USER_VAR": "kept"}})


@ray.remote
class Probe:
    def report(self):
        import os

        return report() + [os.environ.get("USER_VAR"), os.environ.get("NRL_VLLM_ASYNC_TIMEOUT_SECONDS")]


print(json.dumps(ray.get(Probe.remote().report.remote())))
ray.shutdown()
