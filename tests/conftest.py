"""Shared test helpers. Most tests run their scenario in a fresh interpreter (as ddtrace's patch tests do), so that
activation, import order and start-up hooks are exercised for real and no test leaks patches into another. The scenario
is a child program, tests/children/<name>.py, run with run_child(name, *args) / run_child_json(...)."""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import nrl_shim

pytest_plugins = ["nrl_shim.testing"]  # the quirk contract (QuirkContract), as plugin packages use it

# The copy of nrl_shim under test (the checkout when pytest runs from it); children must import the same one.
SOURCE_ROOT = str(Path(nrl_shim.__file__).resolve().parent.parent)


# Variables the shim sets in a process where it is active (this one, when a test activates it here): a child must
# not inherit them from the test process, or it would start with the shim's choice already made.
_SHIM_SET = ("VLLM_USE_V1", "VLLM_ENFORCE_STRICT_TOOL_CALLING")


def child_env(extra=None, clear_nrl=True):
    """os.environ without any NRL_* leftovers or variables the shim sets (_SHIM_SET), plus `extra`, with PYTHONPATH pointing at this checkout."""
    env = {k: v for k, v in os.environ.items() if not (clear_nrl and (k.startswith("NRL_") or k in _SHIM_SET))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SOURCE_ROOT, env.get("PYTHONPATH")]))
    # `nrl-shim run` keeps each job's report under $XDG_STATE_HOME: the tests' jobs keep theirs out of the home dir.
    env.setdefault("XDG_STATE_HOME", _TEST_STATE)
    env.update(extra or {})
    return env


_TEST_STATE = os.path.join(tempfile.gettempdir(), f"nrl-shim-test-state-{os.getuid()}")


def strict_stops_here(but=(), library=None):
    """The fixes (ids, comma-joined) that strict mode stops a job for at activation with this interpreter's libraries
    (activation._stop_if_any_fix_out_of_range: a release with the bug the fix can't reach, no CASE), save `but`; e.g.
    vllm-prefix-cache-refit(-v0) on vLLM 0.8.5. A strict child that shows another fix's behaviour disables them
    (NRL_SHIM_DISABLE), as a user of that release would. `library`: only the fixes for that library."""
    from nrl_shim import registry

    stopped = []
    for quirk in registry.quirks():
        if quirk.id in but or (library is not None and quirk.library != library):
            continue
        applies, installed, _ = quirk.gate()
        if not applies and installed is not None and not quirk.case:
            stopped.append(quirk.id)
    return ",".join(stopped)


CHILDREN_DIR = Path(__file__).resolve().parent / "children"


def child_path(name):
    """The file of child program `name`: tests/children/<name>.py."""
    path = CHILDREN_DIR / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no child program {name!r}: {path} does not exist")
    return str(path)


def _run(argv, env, timeout, check, cwd):
    proc = subprocess.run(argv, env=child_env(env), capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"child failed (rc={proc.returncode})\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def _last_json(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_child(name, *args, env=None, flags=(), timeout=300, check=True, cwd=None):
    """Run the child program tests/children/<name>.py with `args` in a fresh interpreter (`flags`, e.g. ("-S",), go
    before the file); return CompletedProcess (text). `env` is added to child_env(). Raises with both outputs when it
    fails (unless check=False)."""
    return _run([sys.executable, *flags, child_path(name), *args], env, timeout, check, cwd)


def run_child_json(name, *args, env=None, **kw):
    """run_child for a child that prints one JSON document as its last stdout line; return (it parsed, process)."""
    proc = run_child(name, *args, env=env, **kw)
    return _last_json(proc), proc


def run_child_cases(name, cases, tmp_path, env=None, timeout=900):
    """Run child program `name` with `cases` as one JSON argument, in tmp_path; return the JSON it prints last. The
    case runner of the engine tests whose child takes its cases on the command line (run_case: from a file)."""
    out, _ = run_child_json(name, json.dumps(cases), env=env, timeout=timeout, cwd=tmp_path)
    return out


def last_json_object(stdout):
    """The last line of `stdout` that starts with a JSON object, read up to that object's end: vLLM's processes log to
    the same stdout, also at exit, and a line of theirs can land right after the result without a newline."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(f"no JSON result on stdout:\n{stdout[-3000:]}")
    return json.JSONDecoder().raw_decode(lines[-1])[0]


def run_tree(args, env=None, cwd=None, timeout=600):
    """Run `python *args` (environment child_env(env)) for a child that prints a JSON object as its result; return
    (that object, CompletedProcess). It must exit 0. On timeout it kills the child and every process it started
    (engine core, workers, stopped ones too) and fails the test with both outputs."""
    argv = [sys.executable, *map(str, args)]
    proc = subprocess.Popen(
        argv, env=child_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        import signal

        import psutil  # a dependency of Ray and vLLM, which every such child runs

        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                child.send_signal(
                    signal.SIGCONT
                )  # a stopped process can't die of SIGKILL until continued on some kernels
                child.kill()
            except psutil.NoSuchProcess:
                pass
        proc.kill()
        stdout, stderr = proc.communicate()
        pytest.fail(f"child hung (> {timeout} s): {args}\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-6000:]}")
    assert proc.returncode == 0, f"child failed (rc={proc.returncode})\n{stdout[-3000:]}\n--- stderr\n{stderr[-6000:]}"
    return last_json_object(stdout), subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def run_case(program, case, tmp_path, env=None, timeout=600, name="case"):
    """Write `case` to <tmp_path>/<name>.json and run_tree(program, that file) in tmp_path."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(case))
    return run_tree([program, path], env=env, cwd=tmp_path, timeout=timeout)


# The fast loop (`nox -s unit`) runs without vLLM, torch, transformers or Ray. A test whose own code imports one of them
# (often in the child program it runs) is skipped there, naming the library, instead of failing. A test's code is its
# source plus the child programs it names (a string literal that names a file in tests/children, as in
# run_child("activation_reload", ...)), plus the files of tests/children those import or name in turn.
_LIBRARIES = ("vllm", "torch", "transformers", "ray")
_IMPORT_LINES = re.compile(r"\bimport\s+([\w., ]+)|\bfrom\s+(\w+)")
_STRING_NAMES = re.compile(r"""["'](\w+)(?:\.py)?["']""")


def _imported(source):
    names = set()
    for plain, package in _IMPORT_LINES.findall(source):
        names.update(part.strip().split(".")[0] for part in plain.split(",") if part.strip())
        names.add(package)
    return names


def _children_imported(names, seen):
    """What the child programs among `names` import, and the tests/children files they import or name in turn."""
    found = set()
    for name in names:
        path = CHILDREN_DIR / f"{name}.py"
        if name in seen or not path.is_file():
            continue
        seen.add(name)
        source = path.read_text()
        imported = _imported(source)
        found |= imported | _children_imported(imported | set(_STRING_NAMES.findall(source)), seen)
    return found


def _code_imports(source):
    return _imported(source) | _children_imported(_STRING_NAMES.findall(source), set())


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
        needed = sorted(_code_imports(source) & missing)
        if needed:
            item.add_marker(pytest.mark.skip(reason=f"needs {', '.join(needed)}, not installed here"))


def fresh_activation(monkeypatch):
    """activation's state for in-process _apply calls: active with default settings, nothing gated, withdrawn,
    patched or skipped yet (each restored after the test)."""
    from nrl_shim import activation, registry

    monkeypatch.setattr(activation._State, "active", True)
    monkeypatch.setattr(activation._State, "settings", registry.load_settings({}))
    for name, empty in (
        ("releases", {}),
        ("withdrawn", {}),
        ("verdicts", {}),
        ("skipped", set()),
        ("patched", set()),
        ("applying", set()),
    ):
        monkeypatch.setattr(activation._State, name, empty)
