"""Every process of a job is covered: multiprocessing (spawn, forkserver, fork), subprocess, Ray actors on a local
cluster and on a separately started one (`ray start`), and the `nrl-shim run` launcher. Real processes throughout."""

import os
import subprocess
import sys

import pytest

from conftest import child_env, run_json

pytest.importorskip("ray", reason="needs ray, not installed here (every scenario here reports through Ray)")

# What a process reports about itself: shim active, and the real Ray function patched once imported.
REPORT = """
def report():
    import os, sys
    import ray._private.worker as w
    from nrl_shim.patching import is_wrapped
    shim = sys.modules.get("nrl_shim")
    return [os.environ.get("NRL_SHIM"), bool(shim and shim.is_active()), is_wrapped(w, "init", "ray-propagate-env")]
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_multiprocessing_children(method, tmp_path):
    # A script file, not -c: spawn/forkserver children re-import the parent's __main__ to find `report`.
    script = tmp_path / "job.py"
    script.write_text(
        REPORT
        + f"""
import json, multiprocessing as mp
import nrl_shim          # explicit import in the parent only; NRL_SHIM was not set
if __name__ == "__main__":
    with mp.get_context("{method}").Pool(1) as pool:
        print(json.dumps(pool.apply_async(report).get(timeout=120)))
"""
    )
    proc = subprocess.run([sys.executable, str(script)], env=child_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == '["1", true, true]'


def test_subprocess_python_child():
    out, _ = run_json(f"""
import json, subprocess, sys
import nrl_shim
code = {REPORT!r} + "\\nimport json; print(json.dumps(report()))"
print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip())
""")
    assert out == ["1", True, True]


def test_ray_actor_on_local_cluster():
    out, _ = run_json(
        REPORT
        + """
import json, ray
import nrl_shim
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")  # loopback only
@ray.remote
class Probe:
    def report(self):
        return report()
print(json.dumps(ray.get(Probe.remote().report.remote())))
ray.shutdown()
""",
        timeout=300,
    )
    assert out == ["1", True, True]


def test_ray_cluster_started_separately_gets_env_via_runtime_env():
    # The cluster is started WITHOUT any NRL_* variable, so its workers only get them through ray.init's runtime_env.
    from ray_cluster import SeparateCluster

    with SeparateCluster(num_cpus=1) as cluster:
        out, proc = run_json(
            REPORT
            + f"""
import json, ray
ray.init(address="{cluster.address}", log_to_driver=False, runtime_env={{"env_vars": {{"USER_VAR": "kept"}}}})
@ray.remote
class Probe:
    def report(self):
        import os
        return report() + [os.environ.get("USER_VAR"), os.environ.get("NRL_VLLM_ASYNC_TIMEOUT_SECONDS")]
print(json.dumps(ray.get(Probe.remote().report.remote())))
ray.shutdown()
""",
            env={"NRL_SHIM": "1", "NRL_VLLM_ASYNC_TIMEOUT_SECONDS": "1200", "RAY_AUTH_MODE": "disabled"},
            timeout=300,
        )
    assert out == ["1", True, True, "kept", "1200"]
    assert "[ray-propagate-env] ray.init runtime_env['env_vars']: {'USER_VAR': 'kept'} -> " in proc.stderr


def _nrl_shim_cli():
    return [os.path.join(os.path.dirname(sys.executable), "nrl-shim")]


def test_launcher_runs_command_with_shim_and_returns_its_exit_code():
    code = REPORT + "import json, sys; print(json.dumps(report())); sys.exit(7)"
    proc = subprocess.run(
        [*_nrl_shim_cli(), "run", "--", sys.executable, "-c", code],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.strip() == '["1", true, true]'


def test_launcher_rejects_bad_settings_with_one_message():
    proc = subprocess.run(
        [*_nrl_shim_cli(), "run", "--", sys.executable, "-c", "print('ran')"],
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
