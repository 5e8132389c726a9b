"""Every process of a job is covered: multiprocessing (spawn, forkserver, fork), subprocess, Ray actors on a local
cluster and on a separately started one (`ray start`), and the `nrl-shim run` launcher. Real processes throughout."""

import os
import subprocess
import sys

import pytest

from conftest import child_env, child_path, run_child, run_child_json

pytest.importorskip("ray", reason="needs ray, not installed here (every scenario here reports through Ray)")

# Each child reports on itself with children/propagation_report.py: shim active, and the real Ray function patched.


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_multiprocessing_children(method):
    # A script file, not -c: spawn/forkserver children re-import the parent's __main__.
    proc = run_child("propagation_multiprocessing", method, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == '["1", true, true]'


def test_subprocess_python_child():
    out, _ = run_child_json("propagation_subprocess")
    assert out == ["1", True, True]


def test_ray_actor_on_local_cluster():
    out, _ = run_child_json("propagation_ray_local", timeout=300)
    assert out == ["1", True, True]


def test_ray_cluster_started_separately_gets_env_via_runtime_env():
    # The cluster is started WITHOUT any NRL_* variable, so its workers only get them through ray.init's runtime_env.
    from ray_cluster import SeparateCluster

    with SeparateCluster(num_cpus=1) as cluster:
        out, proc = run_child_json(
            "propagation_ray_separate_cluster",
            cluster.address,
            env={"NRL_SHIM": "1", "NRL_VLLM_ASYNC_TIMEOUT_SECONDS": "1200", "RAY_AUTH_MODE": "disabled"},
            timeout=300,
        )
    assert out == ["1", True, True, "kept", "1200"]
    assert "[ray-propagate-env] ray.init runtime_env['env_vars']: {'USER_VAR': 'kept'} -> " in proc.stderr


def _nrl_shim_cli():
    return [os.path.join(os.path.dirname(sys.executable), "nrl-shim")]


def test_launcher_runs_command_with_shim_and_returns_its_exit_code():
    proc = subprocess.run(
        [*_nrl_shim_cli(), "run", "--", sys.executable, child_path("propagation_report"), "7"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.strip() == '["1", true, true]'


def test_launcher_rejects_bad_settings_with_one_message():
    proc = subprocess.run(
        [*_nrl_shim_cli(), "run", "--", sys.executable, child_path("user_program")],
        env=child_env({"NRL_VLLM_USE_V1": "maybe"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (
        "nrl-shim: error: NRL_VLLM_USE_V1='maybe' is not valid; accepted: 1 or 0 (also true/false, yes/no, on/off)"
    )


def test_launcher_missing_command():
    proc = subprocess.run(
        [*_nrl_shim_cli(), "run", "--", "no-such-program-xyz"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 127 and "no-such-program-xyz" in proc.stderr
