"""The patcher contract, checked for every registered quirk (ddtrace's PatchTestCase idea): a new quirk gets these
checks by being registered. Each runs in fresh interpreters (tests/contract_child.py) against the real libraries of
this venv; a quirk whose library is absent or out of range here is skipped with the reason."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nrl_shim import registry

from conftest import SOURCE_ROOT, child_env

HERE = Path(__file__).resolve().parent
QUIRKS = registry.quirks()


def run_child(quirk_id, order):
    proc = subprocess.run(
        [sys.executable, str(HERE / "contract_child.py"), quirk_id, order],
        env=child_env({"NRL_SHIM": "0"}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def applicable(quirk):
    applies, _version, reason = quirk.gate()
    if not applies:
        pytest.skip(f"{quirk.id}: {reason}")


@pytest.mark.parametrize("quirk", QUIRKS, ids=[q.id for q in QUIRKS])
def test_targets_imported_before_activation(quirk):
    applicable(quirk)
    out = run_child(quirk.id, "before")
    assert out["targets"], f"{quirk.id}: none of its targets is importable here"
    assert out["patched"] == sorted(out["targets"])  # every target patched, once
    for label, entry in out["wrapped"].items():
        assert entry["layers"] == 1, (label, entry)  # activate() twice: still one layer
        if "pickles" in entry:
            assert entry["pickles"] is True, (label, entry)
            assert entry["signature_kept"] in (True, "no signature"), (label, entry)
    assert all(out["restored"].values()), out["restored"]  # deactivate() puts every original back
    assert all(out["over_other_tool"].values()), out["over_other_tool"]
    assert all(out["other_tool_kept"].values()), out["other_tool_kept"]


@pytest.mark.parametrize("quirk", QUIRKS, ids=[q.id for q in QUIRKS])
def test_targets_imported_after_activation(quirk):
    applicable(quirk)
    out = run_child(quirk.id, "after")
    assert out["patched"] == sorted(out["targets"])
    assert all(count == 1 for count in out["layers"].values()), out["layers"]


def test_every_quirk_module_is_registered_and_has_a_test_module():
    package = Path(SOURCE_ROOT) / "nrl_shim" / "quirks"
    modules = {f"nrl_shim.quirks.{p.stem}" for p in package.glob("*.py") if not p.stem.startswith("_")}
    assert modules == set(registry.QUIRK_MODULES)
    for name in registry.QUIRK_MODULES:
        stem = name.rpartition(".")[2]
        assert (HERE / f"test_{stem}.py").is_file(), f"{name} has no tests/test_{stem}.py"


def test_every_quirk_declares_what_the_core_and_the_docs_need():
    for quirk in QUIRKS:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", quirk.id), quirk.id
        assert quirk.summary and quirk.link.startswith("https://") and quirk.targets
        assert quirk.library and quirk.versions
        for variable in quirk.settings:
            assert variable.name.startswith("NRL_") and variable.accepted and variable.meaning


def test_readme_tables_are_the_declarations():
    readme = (Path(SOURCE_ROOT) / "README.md").read_text()
    from nrl_shim.docs import markdown_tables

    for line in markdown_tables().splitlines():
        assert line in readme, (
            f"README.md is out of date; missing line:\n{line}\n(print them: see nrl_shim.docs.markdown_tables)"
        )


def test_pre_targets_are_targets_and_carried_in_the_index():
    """PRE_TARGETS (hooks run before a target module executes): each a declared target with a callable, and the
    generated index lists them so activation knows them without importing the quirk modules."""
    from nrl_shim import _quirk_index

    declared = []
    for quirk in QUIRKS:
        hooks = getattr(quirk.module, "PRE_TARGETS", {})
        assert isinstance(hooks, dict), quirk.id
        for name, before in hooks.items():
            assert name in quirk.targets and callable(before), (quirk.id, name)
            declared.append((name, quirk.id))
    assert tuple(declared) == _quirk_index.PRE_TARGETS == registry._pre_entries()


WITH_PRE_TARGETS = [q for q in QUIRKS if getattr(q.module, "PRE_TARGETS", None)]


@pytest.mark.parametrize("quirk", WITH_PRE_TARGETS, ids=[q.id for q in WITH_PRE_TARGETS])
def test_pre_targets_run_before_the_module_executes(quirk):
    applicable(quirk)
    proc = subprocess.run(
        [sys.executable, str(HERE / "children" / "pre_target_order.py"), quirk.id],
        env=child_env({"NRL_SHIM": "0"}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["errors"] == {}, out
    if not out["seen"]:
        pytest.skip(f"{quirk.id}: none of its PRE_TARGETS is importable here")
    for name, entry in out["seen"].items():
        assert entry["names_before"] == 0, (name, entry)  # ran before the module's own code
        assert entry["undone_after_exec"] in (None, True), (name, entry)  # its undo ran after, if it returned one
        assert [quirk.id, name] in out["patched"]  # and the target's patch() ran after, as for any target


def test_variables_are_declared_once():
    names = [v.name for v in registry.variables()]
    assert len(names) == len(set(names)), names
