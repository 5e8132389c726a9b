"""Shared test helpers. Most tests run their scenario in a fresh interpreter (as ddtrace's patch tests do), so that
activation, import order and start-up hooks are exercised for real and no test leaks patches into another."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import nrl_shim

# The copy of nrl_shim under test (the checkout when pytest runs from it); children must import the same one.
SOURCE_ROOT = str(Path(nrl_shim.__file__).resolve().parent.parent)


def child_env(extra=None, clear_nrl=True):
    """os.environ without any NRL_*/VLLM_USE_V1 leftovers, plus `extra`, with PYTHONPATH pointing at this checkout."""
    env = {k: v for k, v in os.environ.items() if not (clear_nrl and (k.startswith("NRL_") or k == "VLLM_USE_V1"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SOURCE_ROOT, env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def run_python(code, env=None, args=(), timeout=300, check=True, cwd=None):
    """Run `code` in a fresh interpreter; return CompletedProcess (text). `env` is added to child_env()."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"child failed (rc={proc.returncode})\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def run_json(code, env=None, **kw):
    """Run `code`, which must print one JSON document as its last stdout line; return it parsed."""
    proc = run_python(code, env=env, **kw)
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc


@pytest.fixture
def python_child():
    return run_python


# The fast loop (`nox -s unit`) runs without vLLM, torch, transformers or Ray. A test whose own code imports one of them
# (often in the child code it runs) is skipped there, naming the library, instead of failing.
_LIBRARIES = ("vllm", "torch", "transformers", "ray")
_IMPORT_LINES = re.compile(r"\bimport\s+([\w., ]+)|\bfrom\s+(\w+)")


def _imported(source):
    names = set()
    for plain, package in _IMPORT_LINES.findall(source):
        names.update(part.strip().split(".")[0] for part in plain.split(",") if part.strip())
        names.add(package)
    return names


def pytest_collection_modifyitems(config, items):
    import importlib.util
    import inspect

    missing = {lib for lib in _LIBRARIES if importlib.util.find_spec(lib) is None}
    if not missing:
        return
    for item in items:
        function = getattr(item, "function", None)
        try:
            source = inspect.getsource(function) if function else ""
        except (OSError, TypeError):
            continue
        needed = sorted(_imported(source) & missing)
        if needed:
            item.add_marker(pytest.mark.skip(reason=f"needs {', '.join(needed)}, not installed here"))
