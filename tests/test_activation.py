"""Activation: import, env var (.pth), launcher; both import orders; idempotence; restore; reload; stacking; threads.

The real target used here is Ray's `ray._private.worker.init` (quirk ray-propagate-env): light enough to import in
many fresh interpreters, and a real third-party function the shim patches.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SOURCE_ROOT, child_env, child_path, fresh_activation, run_child, run_child_json, strict_stops_here


@pytest.mark.parametrize("order", ["shim_first", "target_first"])
def test_import_activates_in_either_order(order):
    out, _ = run_child_json("activation_import_order", order)
    assert out == [
        True,
        1,
        True,
        [["ray-propagate-env", name] for name in ("ray._private.worker", "ray.actor", "ray.remote_function")],
    ]


def test_activate_idempotent_deactivate_restores_and_reactivates():
    out, _ = run_child_json("activation_idempotent_reactivate")
    assert out == [1, True, 1, True]


def test_deactivate_removes_exported_variable_and_import_watcher():
    out, _ = run_child_json("activation_deactivate_cleans_up")
    assert out == ["1", True, None, False, False]


def test_reload_of_patched_target_reapplies_once():
    out, _ = run_child_json("activation_reload_reapplies")
    assert out == [1, 1, 1, "ray._private.worker"]


def test_reload_while_deactivated_leaves_original():
    out, _ = run_child_json("activation_reload_while_deactivated")
    assert out == [0, "function"]


def test_other_wrapper_stacked_over_ours_survives_deactivate():
    out, _ = run_child_json("activation_other_wrapper_over_ours")
    # Theirs stays on top; ours becomes a pass-through and is switched back on: applied exactly once either way.
    assert out == [True, 0, 1, True]


def test_other_wrapper_under_ours_is_kept():
    out, _ = run_child_json("activation_other_wrapper_under_ours")
    assert out == [1, True]


def test_wrapped_function_keeps_signature_name_doc_and_pickles():
    out, _ = run_child_json("activation_wrapped_function_metadata")
    assert out == [True, True, "init", True, True, True]


def test_eight_threads_importing_targets_patch_each_once():
    out, _ = run_child_json("activation_threads_import_targets", timeout=400)
    counts, alive, errors = out
    assert not any(alive), "deadlock: an import thread never finished"
    assert errors == []
    assert counts and set(counts.values()) == {1}, counts


def test_env_activation_via_pth_and_no_wrapt_until_a_target():
    out, _ = run_child_json("activation_env_pth", env={"NRL_SHIM": "1"})
    assert out == [True, False, True, True]


@pytest.mark.parametrize("value", [None, "0"])
def test_env_activation_off(value):
    env = {} if value is None else {"NRL_SHIM": value}
    out, _ = run_child_json("activation_env_off", env=env)
    # Unset: the hook does nothing, `import nrl_shim` activates. 0: off even on import.
    assert out == [False, value is None]


def test_invalid_setting_under_env_activation_exits_with_one_message():
    proc = run_child("user_program", env={"NRL_SHIM": "1", "NRL_VLLM_ASYNC_TIMEOUT_SECONDS": "soon"}, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "nrl-shim: error: NRL_VLLM_ASYNC_TIMEOUT_SECONDS='soon' is not valid; "
        "accepted: a positive, finite number of seconds, e.g. 600 or 1.5"
    ]


def test_invalid_setting_on_import_raises_shim_error():
    proc = run_child("activation_invalid_setting_on_import")
    assert proc.stdout.startswith("SettingsError | NRL_SHIM_DISABLE='no-such-quirk' is not valid")


def test_leftover_pth_without_package_keeps_python_working(tmp_path):
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    shutil.copy(Path(SOURCE_ROOT) / "nrl_shim.pth", site_dir / "nrl_shim.pth")
    env = child_env({"NRL_SHIM": "1"})
    env.pop("PYTHONPATH")
    proc = subprocess.run(
        [sys.executable, "-S", child_path("activation_leftover_pth"), SOURCE_ROOT, str(site_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
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
    proc = run_child("activation_version_range_skip")
    assert "imported function" in proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if "fix skipped" in line]
    assert (
        len(warnings) == 1 and "[ray-propagate-env]" in warnings[0] and "outside the supported range <1" in warnings[0]
    )

    # Only ray-propagate-env's skip: fixes strict mode stops at activation on this install (vLLM 0.8.5's prefix-cache
    # gaps) are disabled, as a user of that release would.
    env = {"NRL_SHIM_STRICT": "1", "NRL_SHIM_DISABLE": strict_stops_here(but=("ray-propagate-env",))}
    proc = run_child("activation_version_range_skip", env=env, check=False)
    assert proc.returncode != 0 and "QuirkSkippedError" in proc.stderr
    assert "NRL_SHIM_DISABLE=ray-propagate-env" in proc.stderr


def test_missing_target_attribute_skips_with_warning():
    proc = run_child("activation_missing_target_attribute")
    assert proc.stdout.strip() == "alive True"
    assert "[ray-propagate-env] fix skipped: could not patch ray._private.worker: AttributeError" in proc.stderr


def test_disabled_quirk_is_not_applied():
    out, _ = run_child_json("activation_disabled_quirk", env={"NRL_SHIM_DISABLE": "ray-propagate-env"})
    assert out == [0, []]


def test_import_pulls_in_no_heavy_module():
    out, _ = run_child_json("activation_no_heavy_imports")
    assert out == []


def test_each_change_is_logged_once_with_before_after_and_why():
    proc = run_child("activation_change_logged_once")
    lines = [line for line in proc.stderr.splitlines() if line.startswith("nrl_shim INFO:")]
    assert lines == [
        "nrl_shim INFO: [vllm-eager-recipes] EngineArgs.enforce_eager: False -> True (see https://example.invalid/why)",
        "nrl_shim INFO: [vllm-eager-recipes] EngineArgs.enforce_eager: None -> True (see https://example.invalid/why)",
    ]


def test_log_level_setting_silences_info():
    proc = run_child("activation_report_one_change", env={"NRL_SHIM_LOG_LEVEL": "WARNING"})
    assert "nrl_shim INFO" not in proc.stderr


def test_also_requires_gates_on_a_second_library():
    pytest.importorskip("torch", reason="needs torch and transformers, not installed here")
    pytest.importorskip("transformers", reason="needs torch and transformers, not installed here")
    out, _ = run_child_json("activation_also_requires")
    declared, applies, outside, absent, transformers, torch = out
    assert declared == {"torch": ">=2.6"} and applies is True
    assert outside == [False, transformers, f"torch {torch} is outside the supported range <1"]
    assert absent == [
        False,
        None,
        "no-such-dist-xyz is not installed (no distribution provides the `no-such-dist-xyz` package)",
    ]


def test_log_level_follows_every_activation():
    proc = run_child("activation_log_level_follows")
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
        m
        for m, deps in graph.items()
        # Above activation: the package, the CLI, and the contract test's child programs (they drive activation).
        if "nrl_shim.activation" in deps
        and m
        not in ("nrl_shim", "nrl_shim.cli", "nrl_shim.testing.contract_child", "nrl_shim.testing.pre_target_order")
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


# --- one gate sequence: a PRE_TARGETS hook (before the target executes) and patch() (after) go through the same
# steps with the same error handling. In-process, on a stand-in quirk module and target: what is tested is
# activation's own sequence.


def _quirk(**declared):
    import types

    from nrl_shim import registry

    module = types.ModuleType("gate_sequence_quirk")
    module.__dict__.update(
        ID="test-gates",
        SUMMARY="a test quirk",
        LINK="https://example.invalid/fix",
        LIBRARY="packaging",
        VERSIONS=">=1",
        TARGETS=("gated_target",),
        PRE_TARGETS={"gated_target": lambda module, settings: None},
        patch=lambda module, settings: setattr(module, "patched", True),
        unpatch=lambda module: vars(module).pop("patched", None),
    )
    module.__dict__.update(declared)
    return registry.Quirk(module)


@pytest.fixture
def gated(monkeypatch):
    """activation active in this process with default settings, nothing gated yet; the quirks _before_exec sees are
    the test's; returns (quirks to give _before_exec, the `nrl_shim` records)."""
    import logging
    import types

    from nrl_shim import registry, report

    fresh_activation(monkeypatch)
    quirks: list = []
    monkeypatch.setattr(registry, "pre_quirks", lambda name, settings: [q for q in quirks if name in q.targets])
    monkeypatch.setattr(report, "_seen", set())
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    report.logger().addHandler(handler)
    yield quirks, records, types.ModuleType("gated_target")
    report.logger().removeHandler(handler)


def _said(records):
    from nrl_shim import job_report

    return [(job_report.kind_of(r), r.getMessage()) for r in records]


def test_a_gate_that_cannot_be_read_skips_before_and_after_execution_never_failing_the_import(gated):
    from nrl_shim import activation

    quirks, records, target = gated
    quirks.append(_quirk(VERSIONS="not a specifier"))
    assert activation._before_exec(target) == []  # before: this raised out of the user's import
    activation._apply(quirks[0], target)
    assert not hasattr(target, "patched") and activation.patched() == []
    (said,) = _said(records)  # one warning for both steps
    assert said[0] == "skipped" and said[1].startswith("[test-gates] fix skipped: cannot check its versions: ")


def test_a_failing_step_is_a_skip_named_by_the_step_and_strict_mode_stops(gated, monkeypatch):
    from nrl_shim import activation, registry
    from nrl_shim.errors import QuirkSkippedError

    quirks, records, target = gated

    def hook(module, settings):
        raise KeyError("boom")

    quirks.append(_quirk(PRE_TARGETS={"gated_target": hook}))
    assert activation._before_exec(target) == []
    assert _said(records) == [("skipped", "[test-gates] fix skipped: could not prepare gated_target: KeyError: 'boom'")]

    monkeypatch.setattr(activation._State, "skipped", set())
    monkeypatch.setattr(activation._State, "settings", registry.load_settings({"NRL_SHIM_STRICT": "1"}))
    with pytest.raises(QuirkSkippedError, match="could not prepare gated_target: KeyError"):
        activation._before_exec(target)


def test_both_steps_run_once_gated_and_say_an_unverified_release_once(gated):
    from nrl_shim import activation

    quirks, records, target = gated
    undone = []
    quirks.append(
        _quirk(VERIFIED="<1", PRE_TARGETS={"gated_target": lambda module, settings: lambda: undone.append(1)})
    )
    for step in activation._before_exec(target):  # as the loader does once the module executed
        step()
    activation._apply(quirks[0], target)
    assert undone == [1] and target.patched is True and activation.patched() == [("test-gates", "gated_target")]
    (said,) = _said(records)
    assert said[0] == "unverified" and said[1].startswith("[test-gates] acts on an unverified release: packaging ")
