"""examples/quirk-plugin, installed for real (`uv pip install --no-deps --target`, or pip) and only on this process's
PYTHONPATH: its quirk (vllm-use-inductor, NeMo RL's translation of vLLM's removed `use_inductor`) in the driver, in
vLLM's own engine-core process, and in a Ray worker with its own Python that has neither nrl-shim nor the plugin
(shipped by ray-propagate-env); its own contract tests through nrl-shim's pytest plugin. Without the shim the failure
shows: EngineArgs raises pydantic's ValidationError."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import SOURCE_ROOT, child_env, child_path, run_tree
from vllm_helpers import REAL_ENGINE

pytestmark = REAL_ENGINE
EXAMPLE = os.path.join(SOURCE_ROOT, "examples", "quirk-plugin")
WORKER_PYTHON = os.environ.get("NRL_SHIM_TEST_WORKER_PYTHON")


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    """The example plugin installed into a directory of its own, as pip or uv install it (dist-info, entry points)."""
    site = tmp_path_factory.mktemp("plugin-site")
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources, not into the checkout then.
    source = tmp_path_factory.mktemp("plugin-src") / "quirk-plugin"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    uv = shutil.which("uv")
    if uv:
        cmd = [uv, "pip", "install", "--quiet", "--no-deps", "--target", str(site), "--python", sys.executable]
    else:
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site)]
    cmd.append(str(source))
    subprocess.run(cmd, check=True, timeout=600)
    assert (site / "nrl_shim_example_quirks").is_dir()
    return site


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from tiny_models import write_model

    return write_model(tmp_path_factory.mktemp("models") / "llama", "llama")


def plugin_env(tmp_path, site, **extra):
    return {
        "PYTHONPATH": os.pathsep.join([SOURCE_ROOT, str(site)]),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        **extra,
    }


def test_without_the_shim_engine_args_fail(tmp_path, plugin_site, llama):
    out, _ = run_tree([child_path("plugin_example_engine"), llama], plugin_env(tmp_path, plugin_site), timeout=600)
    assert "ValidationError" in out["engine_args_error"] and "use_inductor" in out["engine_args_error"]


def test_the_plugin_applies_in_the_driver_and_in_vllms_own_processes(tmp_path, plugin_site, llama):
    env = plugin_env(tmp_path, plugin_site, NRL_SHIM="1", VLLM_ALLOW_INSECURE_SERIALIZATION="1")
    out, proc = run_tree([child_path("plugin_example_engine"), llama, "engine"], env, timeout=900)
    print(json.dumps(out, indent=1))
    assert out["engine_args_backend"] == "eager" and out["llm_backend"] == "eager"
    core = out["vllm_process"]
    assert core["pid"] != out["pid"]  # vLLM's engine core: a process of its own
    assert core["patched"] == ["vllm.config.compilation"] and core["backend"] == "eager"
    assert core["plugin_file"].startswith(str(plugin_site)) and out["generated"] == 1
    assert "[vllm-use-inductor] CompilationConfig(...) compilation_config" in proc.stderr
    assert "[vllm-use-inductor] LLM(...) compilation_config" in proc.stderr


def test_the_plugins_own_contract_tests_pass(tmp_path, plugin_site):
    # What the plugin's CI runs: its tests, through nrl-shim's pytest plugin (nrl_shim.testing).
    env = child_env(plugin_env(tmp_path, plugin_site))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0 and "3 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.ray_cluster
@pytest.mark.skipif(not WORKER_PYTHON, reason="NRL_SHIM_TEST_WORKER_PYTHON is not set; `nox -s vllm_cpu` sets it")
def test_the_plugin_reaches_a_ray_worker_with_its_own_python(tmp_path, plugin_site):
    # The worker's interpreter has vLLM and Ray but neither nrl-shim nor the plugin: both are shipped by the driver.
    from ray_cluster import SeparateCluster

    with SeparateCluster(num_cpus=2) as cluster:
        env = plugin_env(tmp_path, plugin_site, NRL_SHIM="1", RAY_ADDRESS=cluster.address)
        out, proc = run_tree([child_path("plugin_example_ray"), WORKER_PYTHON], env, timeout=600)
    print(json.dumps(out, indent=1))
    assert out["worker_python"] == WORKER_PYTHON and out["active"]
    assert out["backend"] == "eager" and out["patched"] == ["vllm.config.compilation"]
    assert str(plugin_site) not in out["plugin_file"]  # Ray's unpacked copy of the shipped package
    assert out["origin"] == "NRL_SHIM_PLUGINS"
