"""The patcher contract, checked for every built-in quirk with the same pytest plugin a plugin package runs over its
own quirks (nrl_shim.testing.QuirkContract, ddtrace's PatchTestCase idea): a new quirk gets these checks by being
registered. Each runs in fresh interpreters (python -m nrl_shim.testing.contract_child) against the real libraries of
this venv; a quirk whose library is absent or out of range here is skipped with the reason."""

from pathlib import Path

import pytest

from nrl_shim import registry
from nrl_shim.testing import QuirkContract

from conftest import SOURCE_ROOT

HERE = Path(__file__).resolve().parent


class TestBuiltinQuirks(QuirkContract):
    quirk_modules = list(registry.QUIRK_MODULES)


def test_every_quirk_module_is_registered_and_has_a_test_module():
    # Quirks live at any depth (quirks/<library>/<topic>/<name>.py); `_`-named modules and packages are helpers.
    package = Path(SOURCE_ROOT) / "nrl_shim" / "quirks"
    modules = {
        ".".join(("nrl_shim", "quirks", *p.relative_to(package).with_suffix("").parts))
        for p in package.rglob("*.py")
        if not any(part.startswith("_") for part in p.relative_to(package).parts)
    }
    assert modules == set(registry.QUIRK_MODULES)
    for quirk_id in registry.quirk_ids():
        if registry.origin(quirk_id) != registry.BUILTIN:
            continue
        test_module = f"test_{quirk_id.replace('-', '_')}.py"  # named after the id users know, not the module's path
        assert (HERE / test_module).is_file(), f"{quirk_id} has no tests/{test_module}"


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


def test_pre_targets_are_targets_and_carried_in_the_index():
    """PRE_TARGETS (hooks run before a target module executes): each a declared target with a callable, and the
    generated index lists them so activation knows them without importing the quirk modules."""
    from nrl_shim import _quirk_index

    declared = []
    for quirk in registry.quirks():
        hooks = getattr(quirk.module, "PRE_TARGETS", {})
        assert isinstance(hooks, dict), quirk.id
        for name, before in hooks.items():
            assert name in quirk.targets and callable(before), (quirk.id, name)
            declared.append((name, quirk.id))
    assert tuple(declared) == _quirk_index.PRE_TARGETS == registry._pre_entries()


def test_variables_are_declared_once():
    names = [v.name for v in registry.variables()]
    assert len(names) == len(set(names)), names
