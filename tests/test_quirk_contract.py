"""The patcher contract, checked for every built-in quirk with the same pytest plugin a plugin package runs over its
own quirks (nrl_shim.testing, ddtrace's PatchTestCase idea): a new quirk gets these checks by being registered. Each
runs in fresh interpreters (python -m nrl_shim.testing.contract_child) against the real libraries of this venv; a quirk
whose library is absent or out of range here is skipped with the reason."""

from pathlib import Path

from nrl_shim import registry
from nrl_shim.testing import QuirkContract

from conftest import SOURCE_ROOT

HERE = Path(__file__).resolve().parent


class TestBuiltinQuirks(QuirkContract):
    quirk_modules = list(registry.QUIRK_MODULES)


def test_every_quirk_module_is_registered_and_has_a_test_module():
    package = Path(SOURCE_ROOT) / "nrl_shim" / "quirks"
    modules = {f"nrl_shim.quirks.{p.stem}" for p in package.glob("*.py") if not p.stem.startswith("_")}
    assert modules == set(registry.QUIRK_MODULES)
    for name in registry.QUIRK_MODULES:
        stem = name.rpartition(".")[2]
        assert (HERE / f"test_{stem}.py").is_file(), f"{name} has no tests/test_{stem}.py"


def test_readme_tables_are_the_declarations():
    readme = (Path(SOURCE_ROOT) / "README.md").read_text()
    from nrl_shim.docs import markdown_tables

    for line in markdown_tables().splitlines():
        assert line in readme, (
            f"README.md is out of date; missing line:\n{line}\n(print them: see nrl_shim.docs.markdown_tables)"
        )


def test_variables_are_declared_once():
    names = [v.name for v in registry.variables()]
    assert len(names) == len(set(names)), names
