"""Activation: import, env var (.pth), launcher; both import orders; idempotence; restore; reload; stacking; threads.

The real target used here is Ray's `ray._private.worker.init` (quirk ray-propagate-env): light enough to import in
many fresh interpreters, and a real third-party function the shim patches.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SOURCE_ROOT, child_env, run_json, run_python

# Counts our enabled layers for a quirk on an attribute, walking the whole wrapper chain.
LAYERS = """
def layers(obj, quirk_id="ray-propagate-env"):
    from nrl_shim.patching import _Layer
    n = 0
    while obj is not None:
        layer = getattr(obj, "_self_wrapper", None)
        if isinstance(layer, _Layer) and layer.quirk_id == quirk_id and layer.enabled:
            n += 1
        obj = getattr(obj, "__wrapped__", None)
    return n
"""


@pytest.mark.parametrize("order", ["shim_first", "target_first"])
def test_import_activates_in_either_order(order):
    first, second = ("import nrl_shim", "import ray") if order == "shim_first" else ("import ray", "import nrl_shim")
    out, _ = run_json(
        LAYERS
        + f"""
{first}
{second}
import json, ray._private.worker as w
print(json.dumps([nrl_shim.is_active(), layers(w.init), ray.init is w.init, nrl_shim.activation.patched()]))
"""
    )
    assert out == [
        True,
        1,
        True,
        [["ray-propagate-env", name] for name in ("ray._private.worker", "ray.actor", "ray.remote_function")],
    ]


def test_activate_idempotent_deactivate_restores_and_reactivates():
    out, _ = run_json(
        LAYERS
        + """
import json, ray, ray._private.worker as w
original = w.init
import nrl_shim
for _ in range(5):
    nrl_shim.activate()
once = layers(w.init)
nrl_shim.deactivate()
restored = w.init is original and ray.init is original
nrl_shim.deactivate()  # twice is fine
nrl_shim.activate()
again = layers(w.init)
print(json.dumps([once, restored, again, ray.init is w.init]))
"""
    )
    assert out == [1, True, 1, True]


def test_deactivate_removes_exported_variable_and_import_watcher():
    out, _ = run_json("""
import json, os, sys
import nrl_shim
exported = os.environ.get("NRL_SHIM")
watching = any(type(f).__name__ == "_TargetFinder" for f in sys.meta_path)
nrl_shim.deactivate()
print(json.dumps([exported, watching, os.environ.get("NRL_SHIM"),
                  any(type(f).__name__ == "_TargetFinder" for f in sys.meta_path), nrl_shim.is_active()]))
""")
    assert out == ["1", True, None, False, False]


def test_reload_of_patched_target_reapplies_once():
    out, _ = run_json(
        LAYERS
        + """
import importlib, json
import nrl_shim, ray._private.worker as w
before = layers(w.init)
importlib.reload(w)
after_reload = layers(w.init)      # reload re-executes the module through our import hook: patched again, once
nrl_shim.activate()                # and re-activating does not stack a second layer
print(json.dumps([before, after_reload, layers(w.init), w.init.__module__]))
"""
    )
    assert out == [1, 1, 1, "ray._private.worker"]


def test_reload_while_deactivated_leaves_original():
    out, _ = run_json(
        LAYERS
        + """
import importlib, json
import nrl_shim, ray._private.worker as w
nrl_shim.deactivate()
importlib.reload(w)
print(json.dumps([layers(w.init), type(w.init).__name__]))
"""
    )
    assert out == [0, "function"]


def test_other_wrapper_stacked_over_ours_survives_deactivate():
    out, _ = run_json(
        LAYERS
        + """
import json, wrapt
import nrl_shim, ray._private.worker as w
calls = []
def other(wrapped, instance, args, kwargs):
    calls.append(1)
    return wrapped(*args, **kwargs)
wrapt.wrap_function_wrapper(w, "init", other)
theirs = w.init
nrl_shim.deactivate()
still_theirs = w.init is theirs
ours_off = layers(w.init)
nrl_shim.activate()
print(json.dumps([still_theirs, ours_off, layers(w.init), w.init is theirs]))
"""
    )
    # Theirs stays on top; ours becomes a pass-through and is switched back on: applied exactly once either way.
    assert out == [True, 0, 1, True]


def test_other_wrapper_under_ours_is_kept():
    out, _ = run_json(
        LAYERS
        + """
import json, wrapt, ray._private.worker as w
def other(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)
wrapt.wrap_function_wrapper(w, "init", other)
theirs = w.init
import nrl_shim
on = layers(w.init)
nrl_shim.deactivate()
print(json.dumps([on, w.init is theirs]))
"""
    )
    assert out == [1, True]


def test_wrapped_function_keeps_signature_name_doc_and_pickles():
    out, _ = run_json("""
import inspect, json, pickle
import ray._private.worker as w
original = w.init
sig, doc = str(inspect.signature(original)), original.__doc__
import nrl_shim, cloudpickle
print(json.dumps([w.init is not original, str(inspect.signature(w.init)) == sig, w.init.__name__, w.init.__doc__ == doc,
                  pickle.loads(pickle.dumps(w.init)) is w.init, cloudpickle.loads(cloudpickle.dumps(w.init)) is w.init]))
""")
    assert out == [True, True, "init", True, True, True]


def test_eight_threads_importing_targets_patch_each_once():
    out, _ = run_json(
        """
import json, threading, importlib
import nrl_shim
from nrl_shim import registry
counts = {}
for quirk in registry.quirks():
    def counting(module, settings, _patch=quirk.patch, _id=quirk.id):
        counts[f"{_id}:{module.__name__}"] = counts.get(f"{_id}:{module.__name__}", 0) + 1
        return _patch(module, settings)
    quirk.patch = counting
# Imported first, in this thread, because they break under concurrent import even without the shim: torch's C
# extension aborts ("generic_type: cannot initialize type ... already defined"), and torch.distributed.tensor.
# experimental <-> ._attention is an import cycle that Python reports as _DeadlockError; Ray's package and its
# ray.actor / ray.remote_function / ray._private.worker import each other (ImportError "partially initialized
# module" or _DeadlockError with 8 threads, shim or not). The other targets (vLLM, transformers, torch's
# parallelize_module) are then imported by 8 threads at once.
import torch, torch.distributed.tensor.experimental, ray
targets = sorted({t for q in registry.quirks() for t in q.targets})
errors, barrier = [], threading.Barrier(8)
def worker(i):
    barrier.wait()
    for name in targets[i % len(targets):] + targets[:i % len(targets)]:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a layout the installed version does not have (e.g. old/new torch CP module)
        except Exception as exc:
            errors.append(repr(exc))
threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join(240) for t in threads]
print(json.dumps([counts, [t.is_alive() for t in threads], errors]))
""",
        timeout=400,
    )
    counts, alive, errors = out
    assert not any(alive), "deadlock: an import thread never finished"
    assert errors == []
    assert counts and set(counts.values()) == {1}, counts


def test_env_activation_via_pth_and_no_wrapt_until_a_target():
    out, _ = run_json(
        """
import json, sys
first = ["nrl_shim" in sys.modules, "wrapt" in sys.modules]
import nrl_shim
active = nrl_shim.is_active()
import ray
print(json.dumps(first + [active, "wrapt" in sys.modules]))
""",
        env={"NRL_SHIM": "1"},
    )
    assert out == [True, False, True, True]


@pytest.mark.parametrize("value", [None, "0"])
def test_env_activation_off(value):
    env = {} if value is None else {"NRL_SHIM": value}
    out, _ = run_json(
        """
import json, sys
loaded = "nrl_shim" in sys.modules
import nrl_shim
print(json.dumps([loaded, nrl_shim.is_active()]))
""",
        env=env,
    )
    # Unset: the hook does nothing, `import nrl_shim` activates. 0: off even on import.
    assert out == [False, value is None]


def test_invalid_setting_under_env_activation_exits_with_one_message():
    proc = run_python(
        "print('user code ran')", env={"NRL_SHIM": "1", "NRL_VLLM_ASYNC_TIMEOUT_SECONDS": "soon"}, check=False
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "nrl-shim: error: NRL_VLLM_ASYNC_TIMEOUT_SECONDS='soon' is not valid; "
        "accepted: a positive, finite number of seconds, e.g. 600 or 1.5"
    ]


def test_invalid_setting_on_import_raises_shim_error():
    proc = run_python("""
import os
os.environ["NRL_SHIM_DISABLE"] = "no-such-quirk"
try:
    import nrl_shim
except ValueError as err:
    print(type(err).__name__, "|", err)
""")
    assert proc.stdout.startswith("SettingsError | NRL_SHIM_DISABLE='no-such-quirk' is not valid")


def test_leftover_pth_without_package_keeps_python_working(tmp_path):
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    shutil.copy(Path(SOURCE_ROOT) / "nrl_shim.pth", site_dir / "nrl_shim.pth")
    code = f"""
import site, sys
sys.path[:] = [p for p in sys.path if p != {SOURCE_ROOT!r} and 'site-packages' not in p]
site.addsitedir({str(site_dir)!r})
print("started", "nrl_shim" in sys.modules)
"""
    env = child_env({"NRL_SHIM": "1"})
    env.pop("PYTHONPATH")
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "started False", "")


def test_pth_is_installed_next_to_the_package():
    import site

    import nrl_shim

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    assert any((Path(d) / "nrl_shim.pth").is_file() for d in dirs), f"nrl_shim.pth not in {dirs}"
    assert (Path(SOURCE_ROOT) / "nrl_shim.pth").read_text().startswith("import os;")
    assert nrl_shim.__version__


def test_skip_outside_version_range_warns_once_and_strict_raises():
    code = """
from nrl_shim import registry
registry.get("ray-propagate-env").versions = "<1"   # declare a range the installed Ray is outside of
import nrl_shim, ray, ray._private.worker as w, importlib
importlib.import_module("ray._private.worker")
print("imported", type(w.init).__name__)
"""
    proc = run_python(code)
    assert "imported function" in proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if "fix skipped" in line]
    assert (
        len(warnings) == 1 and "[ray-propagate-env]" in warnings[0] and "outside the supported range <1" in warnings[0]
    )

    proc = run_python(code, env={"NRL_SHIM_STRICT": "1"}, check=False)
    assert proc.returncode != 0 and "QuirkSkippedError" in proc.stderr
    assert "NRL_SHIM_DISABLE=ray-propagate-env" in proc.stderr


def test_missing_target_attribute_skips_with_warning():
    proc = run_python("""
import ray._private.worker as w
del w.init                       # a release where the function we patch does not exist
import nrl_shim
print("alive", nrl_shim.is_active())
""")
    assert proc.stdout.strip() == "alive True"
    assert "[ray-propagate-env] fix skipped: could not patch ray._private.worker: AttributeError" in proc.stderr


def test_disabled_quirk_is_not_applied():
    out, _ = run_json(
        LAYERS
        + """
import json, nrl_shim, ray._private.worker as w
print(json.dumps([layers(w.init), nrl_shim.activation.patched()]))
""",
        env={"NRL_SHIM_DISABLE": "ray-propagate-env"},
    )
    assert out == [0, []]


def test_import_pulls_in_no_heavy_module():
    out, _ = run_json("""
import json, sys
import nrl_shim
print(json.dumps(sorted(m for m in ("torch", "vllm", "transformers", "numpy", "ray", "wrapt") if m in sys.modules)))
""")
    assert out == []


def test_each_change_is_logged_once_with_before_after_and_why():
    proc = run_python("""
import nrl_shim
from nrl_shim import report
for _ in range(3):
    report.changed("vllm-eager-recipes", "EngineArgs.enforce_eager", False, True, "see https://example.invalid/why")
report.changed("vllm-eager-recipes", "EngineArgs.enforce_eager", None, True, "see https://example.invalid/why")
""")
    lines = [line for line in proc.stderr.splitlines() if line.startswith("nrl_shim INFO:")]
    assert lines == [
        "nrl_shim INFO: [vllm-eager-recipes] EngineArgs.enforce_eager: False -> True (see https://example.invalid/why)",
        "nrl_shim INFO: [vllm-eager-recipes] EngineArgs.enforce_eager: None -> True (see https://example.invalid/why)",
    ]


def test_log_level_setting_silences_info():
    proc = run_python(
        """
import nrl_shim
from nrl_shim import report
report.changed("vllm-eager-recipes", "EngineArgs.enforce_eager", False, True, "why")
""",
        env={"NRL_SHIM_LOG_LEVEL": "WARNING"},
    )
    assert "nrl_shim INFO" not in proc.stderr


def test_also_requires_gates_on_a_second_library():
    pytest.importorskip("torch", reason="needs torch and transformers, not installed here")
    pytest.importorskip("transformers", reason="needs torch and transformers, not installed here")
    out, _ = run_json("""
import json
from importlib.metadata import version
from nrl_shim import registry
quirk = registry.get("cp-gemma3")              # transformers fix that acts through torch's context_parallel
declared = quirk.also_requires
applies = quirk.gate()[0]
quirk.also_requires = {"torch": "<1"}          # a range the installed torch is outside of
outside = quirk.gate()
quirk.also_requires = {"no-such-dist-xyz": ">=0"}
absent = quirk.gate()
print(json.dumps([declared, applies, outside, absent, version("transformers"), version("torch")]))
""")
    declared, applies, outside, absent, transformers, torch = out
    assert declared == {"torch": ">=2.6,<2.16"} and applies is True
    assert outside == [False, transformers, f"torch {torch} is outside the supported range <1"]
    assert absent == [
        False,
        None,
        "no-such-dist-xyz is not installed (no distribution provides the `no-such-dist-xyz` package)",
    ]


def test_log_level_follows_every_activation():
    proc = run_python("""
import os
import nrl_shim
from nrl_shim import report
report.changed("vllm-eager-recipes", "first", False, True, "why")
nrl_shim.deactivate()
os.environ["NRL_SHIM_LOG_LEVEL"] = "ERROR"
settings = nrl_shim.activate()
import logging
print(settings.log_level, logging.getLogger("nrl_shim").level)
report.changed("vllm-eager-recipes", "second", False, True, "why")
""")
    assert proc.stdout.split() == ["40", "40"]
    assert "first" in proc.stderr and "second" not in proc.stderr


def test_dependencies_point_down_and_there_are_no_import_cycles():
    # Layers: settings -> registry -> activation; quirks and helpers below activation never import it (they get what
    # they need handed down). Read from the sources, so every import (top level or inside a function) counts.
    import ast
    from pathlib import Path

    import nrl_shim

    package = Path(nrl_shim.__file__).parent
    graph = {}
    for path in package.rglob("*.py"):
        if "_vendor" in path.parts:
            continue
        name = ".".join(("nrl_shim", *path.relative_to(package).with_suffix("").parts)).removesuffix(".__init__")
        is_package = path.name == "__init__.py"
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = node.module if node.level == 0 else ".".join(filter(None, [base, node.module]))
                if target and target.startswith("nrl_shim"):
                    deps.add(target)
                    deps.update(f"{target}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names if alias.name.startswith("nrl_shim"))
        graph[name] = deps
    modules = set(graph)
    # A package's __init__ is imported with each of its submodules anyway: an import of the parent is no cycle.
    graph = {m: {d for d in deps if d in modules and d != m and not m.startswith(d + ".")} for m, deps in graph.items()}
    upward = sorted(
        m for m, deps in graph.items() if "nrl_shim.activation" in deps and m not in ("nrl_shim", "nrl_shim.cli")
    )
    assert upward == [], f"modules below activation that import it: {upward}"

    def cycle_from(start):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for dep in graph[node]:
                if dep == start:
                    return path + [dep]
                if dep not in seen and dep != "nrl_shim":  # the package __init__ imports everything by design
                    seen.add(dep)
                    stack.append((dep, path + [dep]))
        return None

    cycles = [c for c in (cycle_from(m) for m in sorted(graph) if m != "nrl_shim") if c]
    assert cycles == [], cycles
