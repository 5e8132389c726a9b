"""The shim reaches every Ray worker of a job, whatever its interpreter: NeMo RL's layout, for real.

A cluster started separately (`ray start`, none of the driver's environment), a driver under `nrl-shim run`, and
actors/tasks whose runtime_env sets `py_executable` to a second venv that has vLLM and Ray but no nrl-shim
(NRL_SHIM_TEST_WORKER_PYTHON; `nox -s vllm_cpu` builds it). Merging with the user's own runtime_env is checked in
the same jobs: their env_vars, py_modules and worker_process_setup_hook keep working.
"""

import glob
import json
import os
import subprocess
import sys

import pytest

from conftest import child_env

ray = pytest.importorskip("ray", reason="Ray is not installed in this interpreter")

from ray_cluster import SeparateCluster  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER_PYTHON = os.environ.get("NRL_SHIM_TEST_WORKER_PYTHON")
pytestmark = [
    pytest.mark.ray_cluster,
    pytest.mark.skipif(
        not WORKER_PYTHON,
        reason="NRL_SHIM_TEST_WORKER_PYTHON (a Python with Ray and vLLM but no "
        "nrl-shim) is not set; `nox -s vllm_cpu` sets it",
    ),
]
CLI = os.path.join(os.path.dirname(sys.executable), "nrl-shim")
USER_HOOK = """
import os, sys


def hook():
    shim = sys.modules.get("nrl_shim")
    os.environ["USER_HOOK_RAN"] = "after-shim" if shim and shim.is_active() else "before-shim"
"""


@pytest.fixture(scope="module")
def cluster():
    with SeparateCluster(num_cpus=2) as running:
        yield running


@pytest.fixture
def user_package(tmp_path):
    """The user's own py_module (uploaded by Ray at the job level) holding their worker setup hook."""
    package = tmp_path / "userpkg" / "user_setup"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(USER_HOOK)
    return package


def run_driver(tmp_path, case, env=None):
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    driver_env = child_env(env)
    driver_env.pop("PYTHONPATH")  # the installed nrl-shim drives; workers must not find a checkout by accident
    # cwd outside the repository: Ray adds the driver's cwd and script dir to its workers' sys.path.
    proc = subprocess.run(
        [CLI, "run", "--", sys.executable, os.path.join(HERE, "ray_driver.py"), str(path)],
        env=driver_env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc


def _case(cluster, user_package, probes, **extra):
    return {
        "address": cluster.address,
        "worker_python": WORKER_PYTHON,
        "probes": probes,
        "user_package_root": str(user_package.parent),
        "job_runtime_env": {
            "env_vars": {"USER_VAR": "kept"},
            "py_modules": [str(user_package)],
            "worker_process_setup_hook": "user_setup.hook",
        },
        **extra,
    }


def test_worker_python_has_no_shim_of_its_own(tmp_path):
    # The premise of this module: without shipping, that interpreter can't import nrl_shim at all.
    proc = subprocess.run(
        [WORKER_PYTHON, "-c", "import nrl_shim"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert proc.returncode != 0 and "No module named 'nrl_shim'" in proc.stderr


def test_every_worker_and_its_children_run_the_shim(cluster, user_package, tmp_path):
    probes = ["actor_own_python", "actor_own_python_and_py_modules", "task_own_python", "actor_driver_python"]
    out, proc = run_driver(tmp_path, _case(cluster, user_package, probes))
    for name in probes:
        state = out[name]
        assert state["active"] is True, (name, state)
        assert state["child_active"] is True, (name, state)
        assert state["spawn_child_active"] is True, (name, state)
        assert "runtime_resources" in state["shim_file"], (name, state)  # the shipped copy
        assert state["user_var"] == "kept" and state["user_hook"] == "after-shim", (name, state)
    assert out["actor_own_python"]["python"] == WORKER_PYTHON
    assert out["actor_driver_python"]["python"] == sys.executable
    job_env = out["job_env"]
    assert len(job_env["py_modules"]) == 2  # the user's package and ours, both uploaded
    assert job_env["env_vars"]["USER_VAR"] == "kept" and job_env["env_vars"]["NRL_SHIM"] == "1"
    assert (
        "[ray-propagate-env] ray.init runtime_env['worker_process_setup_hook']: 'user_setup.hook' -> "
        "'nrl_shim.ray_worker.setup, then user_setup.hook'" in proc.stderr
    )
    assert "[ray-propagate-env] actor/task runtime_env['py_modules']" in proc.stderr
    # The driver's own venv has nrl-shim installed: its worker ran the shipped copy and said so, once.
    logs = "".join(
        open(f, errors="replace").read()
        for f in glob.glob(os.path.join(cluster.temp_dir, "session_latest", "logs", "*.err"))
    )
    assert "running the driver's shipped copy" in logs


def test_gemma_fix_inside_an_actor_with_its_own_venv(cluster, user_package, tmp_path):
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from tiny_models import write_model

    gemma = write_model(tmp_path / "gemma", "gemma3_text")
    out, _ = run_driver(tmp_path, _case(cluster, user_package, ["gemma_engine"], gemma_dir=gemma))
    engine = out["gemma_engine"]
    assert engine["load_format"] == "auto"
    assert any("[vllm-gemma-load-format] vllm load_format for gemma3_text model" in line for line in engine["log"])
    assert engine["state"]["python"] == WORKER_PYTHON and engine["state"]["child_active"] is True


def test_shipping_off_leaves_workers_without_the_shim(cluster, user_package, tmp_path):
    out, proc = run_driver(tmp_path, _case(cluster, user_package, ["actor_own_python"]), env={"NRL_SHIM_RAY_SHIP": "0"})
    state = out["actor_own_python"]
    assert state["active"] is False and state["shim_file"] is None
    assert state["user_hook"] == "before-shim" and state["user_var"] == "kept"
    assert len(out["job_env"]["py_modules"]) == 1
    assert "py_modules" not in proc.stderr
