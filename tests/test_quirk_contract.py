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
    if not quirk.targets:
        pytest.skip(f"{quirk.id}: no targets, it acts through setup() (test_setup_is_undone_by_teardown)")
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


SET_UP = [q for q in QUIRKS if q.setup_argv is not None]


@pytest.mark.parametrize("quirk", SET_UP, ids=[q.id for q in SET_UP])
def test_setup_is_undone_by_teardown(quirk):
    # Whatever setup() installs at activation (import-system entries, exported variables) is there once however often
    # activation runs, and deactivation takes it away again.
    out = run_child(quirk.id, "setup")
    assert out["once"], out
    assert out["restored"], out


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
        assert quirk.summary and quirk.link.startswith("https://")
        assert quirk.targets or quirk.setup_argv is not None, f"{quirk.id}: no targets and no setup(): it does nothing"
        assert quirk.library and quirk.versions
        for variable in quirk.settings:
            assert variable.name.startswith("NRL_") and variable.accepted and variable.meaning


def test_docs_tables_are_the_declarations():
    # The generated tables (quirks in README.md, variables in docs/settings.md) are exactly what the declarations give.
    from nrl_shim.docs import GENERATED, generated_blocks

    for name, blocks in GENERATED.items():
        found = generated_blocks((Path(SOURCE_ROOT) / name).read_text())
        for block, make in blocks.items():
            assert found.get(block) == make() + "\n", (
                f"{name}: the generated table {block!r} is out of date: run `python -m nrl_shim.docs`"
            )


def test_docs_generation_rewrites_only_the_blocks(tmp_path):
    from nrl_shim.docs import render

    text = "# t\n\n<!-- generated: quirks (python -m nrl_shim.docs) -->\nold\n<!-- end generated -->\n\nkept\n"
    out = render(text, {"quirks": lambda: "| new |"})
    assert (
        out == "# t\n\n<!-- generated: quirks (python -m nrl_shim.docs) -->\n| new |\n<!-- end generated -->\n\nkept\n"
    )
    with pytest.raises(ValueError, match="no markers"):
        render("no markers here", {"quirks": lambda: "x"})


def test_variables_are_declared_once():
    names = [v.name for v in registry.variables()]
    assert len(names) == len(set(names)), names
