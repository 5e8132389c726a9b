"""Reliability under Ray: an engine actor killed mid-rollout, and a second node.

A cluster started separately (`ray start`, on 127.0.0.1, none of the driver's environment) with two nodes: the head and
a second node carrying a custom resource. The driver runs under `nrl-shim run`; every actor uses the worker venv
(NRL_SHIM_TEST_WORKER_PYTHON: vLLM and Ray, no nrl-shim) as its `py_executable`, so the shim reaches it only through
Ray. The driver program is tests/children/reliability_ray_driver.py.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import child_env, child_path

ray = pytest.importorskip("ray", reason="Ray is not installed in this interpreter")

from ray_cluster import SeparateCluster  # noqa: E402

WORKER_PYTHON = os.environ.get("NRL_SHIM_TEST_WORKER_PYTHON")
NODE_RESOURCE = "reliability_node2"
pytestmark = [
    pytest.mark.ray_cluster,
    pytest.mark.skipif(
        not WORKER_PYTHON,
        reason="NRL_SHIM_TEST_WORKER_PYTHON (a Python with Ray and vLLM but no nrl-shim) is not set; "
        "`nox -s vllm_cpu` sets it",
    ),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed in this interpreter"),
]
CLI = os.path.join(os.path.dirname(sys.executable), "nrl-shim")


class SecondNode(SeparateCluster):
    """A second node joining a running cluster (`ray start --address=...`), with a custom resource and its own temp
    dir; stopped like SeparateCluster, through the processes found by that temp dir."""

    def __init__(self, head_address, resources, num_cpus=1):
        super().__init__(num_cpus=num_cpus)  # its own temp dir: stop() finds only this node's processes
        self.address = head_address
        self.resources = resources

    def __enter__(self):
        ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
        start = [
            ray_bin,
            "start",
            f"--address={self.address}",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.num_cpus}",
            f"--resources={json.dumps(self.resources)}",
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
        ]
        started = subprocess.run(start, env=self.env, capture_output=True, text=True, timeout=180, cwd=self.temp_dir)
        if started.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start (second node) failed:\n{started.stdout}\n{started.stderr}")
        return self


@pytest.fixture(scope="module")
def cluster():
    with SeparateCluster(num_cpus=2) as head, SecondNode(head.address, {NODE_RESOURCE: 1}) as node:
        yield head, node


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    from tiny_models import write_model

    return write_model(tmp_path_factory.mktemp("models") / "gemma", "gemma3_text")


def run_driver(tmp_path, case, env=None):
    path = tmp_path / "case.json"
    path.write_text(json.dumps({**case, "tmp": str(tmp_path)}))
    # The checkout's nrl_shim drives (PYTHONPATH); Ray gives workers only the script's directory and the cwd, so
    # they can reach the shim only through what the driver ships. cwd outside the repository.
    proc = subprocess.run(
        [CLI, "run", "--", sys.executable, child_path("reliability_ray_driver"), str(path)],
        env=child_env({"RAY_AUTH_MODE": "disabled", **(env or {})}),
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    # The last JSON line: vLLM may print its shutdown after it.
    out = json.loads(next(line for line in reversed(proc.stdout.splitlines()) if line.startswith("{")))
    print(json.dumps(out, indent=1)[:4000])  # shown with -s: the figures for the README
    return (out, proc) if env is not None else out


GEMMA_FIX = "[vllm-gemma-load-format] vllm load_format for gemma3_text model"


def test_engine_actor_killed_mid_rollout_restarts_with_the_shim(cluster, gemma, tmp_path):
    head, _ = cluster
    out = run_driver(
        tmp_path,
        {"scenario": "actor_restart", "address": head.address, "worker_python": WORKER_PYTHON, "gemma_dir": gemma},
    )
    first, error, second = out["first"], out["error"], out["second"]
    # Before: the actor runs in its own venv with the shipped shim, and its engine got the Gemma fix.
    for state in (first, second):
        assert state["python"] == WORKER_PYTHON and state["active"] is True, state
        assert "runtime_resources" in state["shim_file"], state  # shipped through Ray, not found on a path
        assert state["load_format"] == "auto", state
        assert any(GEMMA_FIX in line and "'dummy' -> 'auto'" in line for line in state["log"]), state["log"]
    assert first["reconstructed"] is False
    # The call in flight fails with Ray's own error for a dead actor (not a hang, not something of the shim's).
    assert error["type"] is not None and error["is_ray_actor_error"] is True, error
    assert "nrl_shim" not in error["message"], error
    # The restarted actor is a new process (max_restarts=1), re-activated by the worker setup hook, its fix re-applied
    # and its engine serving.
    assert second["reconstructed"] is True and second["pid"] != first["pid"], second
    assert out["second_rollout"]["tokens"] == [16] * 8, out["second_rollout"]


def test_actor_on_a_second_node_runs_the_shim(cluster, gemma, tmp_path):
    head, node = cluster
    out = run_driver(
        tmp_path,
        {
            "scenario": "second_node",
            "address": head.address,
            "worker_python": WORKER_PYTHON,
            "gemma_dir": gemma,
            "node_resource": NODE_RESOURCE,
        },
    )
    assert out["nodes"] == 2, out
    state = out["state"]
    # Placed by the custom resource on the second node, not the driver's.
    assert out["resource_node"] == [state["node_id"]] and state["node_id"] != out["driver_node"], out
    assert state["python"] == WORKER_PYTHON and state["active"] is True, state
    # The shim package was unpacked by that node's own Ray (its temp dir), not taken from the head's.
    assert state["shim_file"].startswith(node.temp_dir) and "runtime_resources" in state["shim_file"], state
    assert out["engine"]["load_format"] == "auto", out["engine"]
    assert any(GEMMA_FIX in line for line in out["engine"]["log"]), out["engine"]


# CI's time (~2 min): the job report across processes is shown on one node by tests/test_job_report.py; the second
# node is a further route, run in `nox -t full`.
@pytest.mark.full
def test_job_report_gathers_every_process_and_the_second_node(cluster, tmp_path):
    """`nrl-shim run` prints what each fix did across the job, and `nrl-shim report --json` reads it: the prefix-cache
    reset of the actor on the second node (records kept on that node, in a directory the head never sees: read
    through a Ray task there) and of the driver engine's own engine-core process; nothing for a process with the shim
    off."""
    from tiny_models import write_model

    head, _ = cluster
    checkpoints = [
        write_model(tmp_path / n, "llama", seed=s, overrides={"max_position_embeddings": 512})
        for n, s in (("a", 0), ("b", 1))
    ]
    node_dir = str(tmp_path / "node2-records")
    state = tmp_path / "state"  # XDG_STATE_HOME: `nrl-shim run` makes the job's directory under it
    case = {
        "scenario": "job_report",
        "address": head.address,
        "worker_python": WORKER_PYTHON,
        "node_resource": NODE_RESOURCE,
        "checkpoints": checkpoints,
        "node_dir": node_dir,
    }
    out, proc = run_driver(tmp_path, case, env={"XDG_STATE_HOME": str(state)})
    assert out["on_node"]["cached"] == [0, 0] and out["driver_cached"] == [0, 0], out  # the resets happened
    (job_dir,) = [str(p) for p in (state / "nrl-shim" / "jobs").iterdir()]
    table = proc.stderr[proc.stderr.index("nrl-shim report: ") :]
    print(table)  # shown with -s: docs/report.md
    line = next(line for line in table.splitlines() if line.startswith("  [vllm-prefix-cache-refit] changed in"))
    node2 = out["on_node"]["node_id"]
    assert "ray actor@" in line and f"node {node2[:6]} (pid {out['on_node']['pid']})" in line, table
    assert "engine core@" in line, table

    report = subprocess.run(
        [CLI, "report", "--json", job_dir],
        env=child_env({"RAY_AUTH_MODE": "disabled"}),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    processes = {p["pid"]: p for p in json.loads(report.stdout)["processes"]}
    actor = processes[out["on_node"]["pid"]]
    assert actor["role"] == "ray actor" and actor["ray_node"] == node2 and actor["python"] == WORKER_PYTHON, actor
    assert actor["source"] == f"ray node {node2[:8]}" and actor["file"] not in os.listdir(job_dir), actor
    resets = [r for r in actor["records"] if r["quirk"] == "vllm-prefix-cache-refit" and r["kind"] == "changed"]
    assert resets and "reset before the next step" in resets[0]["message"], actor["records"]
    (core,) = [p for p in processes.values() if p["role"] == "engine core" and p["ppid"] == out["driver_pid"]]
    assert any(r["quirk"] == "vllm-prefix-cache-refit" and r["kind"] == "changed" for r in core["records"]), core
    assert processes[out["driver_pid"]]["role"] == "driver"
    assert out["children"]["shim_on"] in processes and out["children"]["shim_off"] not in processes
