"""The driver imports nrl_shim and starts a local Ray cluster (loopback only); an actor reports on itself."""

import json

import ray
from propagation_report import report

import nrl_shim  # noqa: F401

ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")  # loopback only


@ray.remote
class Probe:
    def report(self):
        return report()


print(json.dumps(ray.get(Probe.remote().report.remote())))
ray.shutdown()
