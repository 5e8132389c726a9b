"""`nrl-shim doctor`: versions, effective settings, each quirk's status and why, env activation checked for real."""

import json
import os
import subprocess
import sys

from conftest import child_env

from nrl_shim import registry

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
    assert report["libraries"]["ray"] == {"version": version("ray"), "distribution": "ray", "also_installed": [],
                                          "text": f"ray {version('ray')}"}
    assert report["settings_error"] is None
    assert report["settings"]["NRL_VLLM_ASYNC_TIMEOUT_SECONDS"] == "900"
    assert report["settings"]["effective"]["async_timeout_s"] == 900.0
    statuses = {q["id"]: q for q in report["quirks"]}
    assert list(statuses) == list(registry.quirk_ids())
    assert statuses["ray-propagate-env"]["status"] == "disabled"
    for quirk in registry.quirks():
        if quirk.id == "ray-propagate-env":
            continue
        applies, installed, reason = quirk.gate()
        assert statuses[quirk.id]["status"] == ("applies" if applies else "skipped")
        assert statuses[quirk.id]["reason"] == reason and statuses[quirk.id]["link"].startswith("https://")
    assert report["env_activation"]["working"] is True and report["env_activation"]["pth"].endswith("nrl_shim.pth")


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
