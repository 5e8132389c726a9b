"""`nrl-shim doctor`: versions, effective settings, each quirk's status and why, env activation checked for real."""

import json
import os
import subprocess
import sys

import pytest

from nrl_shim import registry

from conftest import child_env

CLI = os.path.join(os.path.dirname(sys.executable), "nrl-shim")


def doctor(*args, env=None):
    return subprocess.run([CLI, "doctor", *args], env=child_env(env), capture_output=True, text=True, timeout=180)


def test_doctor_json_reports_everything():
    proc = doctor("--json", env={"NRL_SHIM_DISABLE": "ray-propagate-env", "NRL_VLLM_ASYNC_TIMEOUT_SECONDS": "900"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["python"].startswith(sys.version.split()[0])
    from importlib.metadata import version

    assert report["libraries"]["wrapt"]["version"] == version("wrapt")
    if report["libraries"]["ray"]["version"] is not None:
        ray_version = version("ray")
        expected = {"version": ray_version, "distribution": "ray", "also_installed": [], "text": f"ray {ray_version}"}
        assert report["libraries"]["ray"] == expected
    assert report["settings_error"] is None and report["exit_status"] == 0
    assert report["settings"]["set"]["NRL_VLLM_ASYNC_TIMEOUT_SECONDS"] == "900"
    # Effective settings as a user writes them, not Python reprs.
    effective = report["settings"]["effective"]
    assert effective["NRL_VLLM_ASYNC_TIMEOUT_SECONDS"] == "900" and effective["NRL_SHIM_LOG_LEVEL"] == "INFO"
    assert effective["NRL_SHIM_DISABLE"] == "ray-propagate-env" and effective["NRL_SHIM_STRICT"] == "0"
    assert effective["NRL_SHIM_RECIPE"] == "(unset)" and effective["NRL_SHIM_EAGER_RECIPES"] == "(none)"
    statuses = {q["id"]: q for q in report["quirks"]}
    assert list(statuses) == list(registry.quirk_ids())
    assert statuses["ray-propagate-env"]["status"] == "disabled"
    for quirk in registry.quirks():
        if quirk.id == "ray-propagate-env":
            continue
        applies, installed, reason = quirk.gate()
        absent = (
            ("fixed-upstream",)
            if quirk.fixed_upstream()
            else ("not-affected",)
            if quirk.unaffected()
            else ("not-installed",)
        )
        expected = ("applies", "idle") if applies else absent if installed is None else ("out-of-range",)
        assert statuses[quirk.id]["status"] in expected, statuses[quirk.id]
        said = reason.removeprefix("not affected: ")  # the state says that
        assert statuses[quirk.id]["reason"].startswith(said) and statuses[quirk.id]["link"].startswith("https://")
    assert report["env_activation"]["working"] is True and report["env_activation"]["pth"].endswith("nrl_shim.pth")


def test_idle_when_there_is_nothing_to_do():
    pytest.importorskip("vllm", reason="vLLM is not installed")
    quirks = {q["id"]: q for q in json.loads(doctor("--json").stdout)["quirks"]}
    assert quirks["vllm-eager-recipes"]["status"] == "idle"
    assert "nothing to do: no recipe" in quirks["vllm-eager-recipes"]["reason"]
    quirks = {
        q["id"]: q
        for q in json.loads(
            doctor(
                "--json", env={"NRL_SHIM_RECIPE": "grpo-deepscaler-1.5b-8K", "NRL_SHIM_GEMMA_LOAD_FORMAT": "off"}
            ).stdout
        )["quirks"]
    }
    assert quirks["vllm-eager-recipes"]["status"] == "applies"
    assert quirks["vllm-gemma-load-format"]["status"] == "idle"
    assert "NRL_SHIM_GEMMA_LOAD_FORMAT=off" in quirks["vllm-gemma-load-format"]["reason"]


def test_strict_exits_3_when_a_fix_would_be_skipped_for_its_version(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed")
    # A real (tiny) distribution `ray` 1.0, first on the path: the Ray fix's range (>= 2.0) excludes it.
    old = tmp_path / "site"
    (old / "ray").mkdir(parents=True)
    (old / "ray" / "__init__.py").write_text("")
    info = old / "ray-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ray\nVersion: 1.0\n")
    (info / "RECORD").write_text("ray/__init__.py,,\n")
    env = {"PYTHONPATH": os.pathsep.join([str(old), child_env()["PYTHONPATH"]])}
    proc = subprocess.run([CLI, "doctor", "--strict"], env=child_env(env), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "ray-propagate-env" in proc.stdout and "out-of-range" in proc.stdout
    assert "ray 1.0 is outside the supported range >=2.0" in proc.stdout
    assert "verdict: a fix would be skipped for its version (exit 3, --strict)" in proc.stdout
    proc = subprocess.run([CLI, "doctor"], env=child_env(env), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Ray's fix among those listed (fixes verified only on newer vLLM releases can be listed too, on an old vLLM).
    (skipped,) = [line for line in proc.stdout.splitlines() if "skipped for their version:" in line]
    assert "ray-propagate-env" in skipped.split("skipped for their version:", 1)[1].split(" (--strict", 1)[0], skipped


def test_not_installed_state():
    import types

    from nrl_shim import cli
    from nrl_shim.registry import load_settings

    module = types.ModuleType("nrl_shim_test_quirk")
    module.__dict__.update(
        ID="x-test",
        SUMMARY="s",
        LINK="https://example.invalid",
        LIBRARY="no_such_lib_xyz",
        VERSIONS=">=1",
        TARGETS=(),
        patch=None,
        unpatch=None,
    )
    entry = cli._quirk_entry(registry.Quirk(module), load_settings({}))
    assert entry["status"] == "not-installed" and "no_such_lib_xyz is not installed" in entry["reason"]


def test_doctor_text_and_invalid_settings_exit_nonzero():
    proc = doctor()
    assert proc.returncode == 0, proc.stderr
    assert "ray-propagate-env" in proc.stdout and "env activation: .pth" in proc.stdout

    proc = doctor(env={"NRL_SHIM_LOG_LEVEL": "chatty"})
    assert proc.returncode == 1
    assert "settings: INVALID: NRL_SHIM_LOG_LEVEL='chatty' is not valid" in proc.stdout


def test_doctor_with_env_activation_on_still_reports():
    # The CLI's own interpreter starts with NRL_SHIM=1 too; it must not die before reporting.
    proc = doctor("--json", env={"NRL_SHIM": "1"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["env_activation"]["working"] is True
