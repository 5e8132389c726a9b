"""The quirk contract as a pytest plugin: what every quirk must do, checked in fresh interpreters against the real
libraries installed (ddtrace's PatchTestCase idea). nrl-shim runs it over its built-in quirks; a package that adds
quirks (entry-point group `nrl_shim.quirks`) runs it over its own:

    # conftest.py
    pytest_plugins = ["nrl_shim.testing"]

    # test_contract.py
    from nrl_shim.testing import QuirkContract

    class TestMyQuirks(QuirkContract):
        quirk_modules = ["my_package.my_quirk"]

Per quirk, in fresh interpreters (`python -m nrl_shim.testing.contract_child`; one per order checks all the class's
quirks, since importing the libraries is most of the cost):
- targets imported *before* activation: every target patched once; activate() twice still one layer per attribute;
  each wrapped callable keeps its signature and pickles; deactivate() puts every original back; with another tool's
  wrapt wrapper already on an attribute, ours goes over it and leaving keeps theirs;
- targets imported *after* activation: patched on import, one layer each;
- setup() (where a quirk has one): what it installs is there once however often activation runs, and gone after
  deactivation;
- the declarations the core and the docs need (id shape, SUMMARY, an https LINK, LIBRARY/VERSIONS that `packaging`
  reads, VERIFIED/REQUIRES/FIXED_BY well formed, NRL_* settings with their texts), and no setting declared twice.
A quirk whose library is absent or outside VERSIONS here is skipped with the reason. The plugin module is found in the
children through its entry point when the package is installed, else through NRL_SHIM_PLUGINS (set here).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from typing import Any, ClassVar

import pytest

from .. import registry

__all__ = ["QuirkContract", "run_contract_child"]


def _roots(module_names: list[str]) -> list[str]:
    """The sys.path entries the children need to import the same nrl_shim and quirk modules as this process."""
    roots = []
    for name in ["nrl_shim", *module_names]:
        top = importlib.import_module(name.partition(".")[0])
        for location in getattr(top, "__path__", None) or [os.path.dirname(str(top.__file__))]:
            root = os.path.dirname(os.path.abspath(location)) if hasattr(top, "__path__") else location
            if root not in roots:
                roots.append(root)
    return roots


def contract_env(module_names: list[str], extra: dict[str, str] | None = None) -> dict[str, str]:
    """A child's environment: no NRL_* leftovers, the shim off until the child activates it, the quirk modules
    reachable (PYTHONPATH, and NRL_SHIM_PLUGINS for those that are not built in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NRL_")}
    entries = [*_roots(module_names), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(entries))
    plugins = [m for m in module_names if m not in registry.QUIRK_MODULES]
    if plugins:
        env["NRL_SHIM_PLUGINS"] = ",".join(plugins)
    env["NRL_SHIM"] = "0"
    env.update(extra or {})
    return env


def run_contract_child(
    order: str, quirk_ids: list[str], env: dict[str, str], timeout: float = 900
) -> dict[str, dict[str, Any]]:
    """`python -m nrl_shim.testing.contract_child ORDER QUIRK_ID...`: each quirk's result, by ID."""
    proc = subprocess.run(
        [sys.executable, "-m", "nrl_shim.testing.contract_child", order, *quirk_ids],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result: dict[str, dict[str, Any]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


class QuirkContract:
    """Subclass it in a test module and list the quirk modules to check (`quirk_modules`); the plugin parametrizes
    each test over them. Override `child_env` to add what the children need (e.g. PYTHONPATH of a test venv)."""

    quirk_modules: ClassVar[list[str]] = []
    # One child per order checks every applicable quirk of the class (importing vLLM and torch is most of a check's
    # cost); each test reads its quirk's entry. Keyed by class, so subclasses don't share results.
    _batches: ClassVar[dict[tuple[type, str], dict[str, dict[str, Any]]]] = {}

    def child_env(self) -> dict[str, str]:
        return contract_env(list(self.quirk_modules))

    @staticmethod
    def _quirk(module_name: str) -> registry.Quirk:
        return registry.Quirk(importlib.import_module(module_name))

    @staticmethod
    def _why_not_applicable(quirk: registry.Quirk) -> str | None:
        if not quirk.targets:
            return f"{quirk.id}: no targets, it acts through setup() (test_setup_is_undone_by_teardown)"
        applies, _version, reason = quirk.gate()
        return None if applies else f"{quirk.id}: {reason}"

    def _applicable(self, quirk: registry.Quirk) -> None:
        why = self._why_not_applicable(quirk)
        if why is not None:
            pytest.skip(why)

    def _contract_result(self, quirk: registry.Quirk, order: str) -> dict[str, Any]:
        key = (type(self), order)
        if key not in self._batches:
            quirks = [self._quirk(module) for module in self.quirk_modules]
            ids = [q.id for q in quirks if self._why_not_applicable(q) is None]
            self._batches[key] = run_contract_child(order, ids, self.child_env())
        out = self._batches[key][quirk.id]
        assert "error" not in out, f"{quirk.id} ({order}):\n{out['error']}"
        return out

    def test_declares_what_the_core_and_the_docs_need(self, quirk_module: str) -> None:
        from packaging.specifiers import SpecifierSet

        quirk = self._quirk(quirk_module)
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", quirk.id), quirk.id
        assert quirk.summary and quirk.link.startswith("https://")
        assert quirk.targets or quirk.setup_argv is not None, f"{quirk.id}: no targets and no setup(): it does nothing"
        assert quirk.library and SpecifierSet(quirk.versions) is not None
        for library, versions in quirk.also_requires.items():
            assert library and SpecifierSet(versions) is not None
        # The version declaration (registry.py): VERIFIED per library it gates on; REQUIRES names its own targets;
        # with VERIFIED declared apart, an upper bound in VERSIONS is upstream's fix, so FIXED_BY says which.
        libraries = {quirk.library, *quirk.also_requires}
        assert set(quirk.verified) <= libraries, f"{quirk.id}: VERIFIED names {set(quirk.verified) - libraries}"
        assert all(SpecifierSet(v) is not None for v in quirk.verified.values())
        for entry in quirk.requires:
            assert re.fullmatch(r"[\w.]+:[\w.]+(\([\w, ]*\))?", entry), f"{quirk.id}: REQUIRES entry {entry!r}"
            assert entry.partition(":")[0] in quirk.targets, f"{quirk.id}: {entry!r} is not in one of its TARGETS"
        # One form for its targets: {module name: (patch, unpatch)}, each target its own functions (registry.py).
        assert isinstance(quirk.module.TARGETS, dict), f"{quirk.id}: TARGETS is not {{module name: (patch, unpatch)}}"
        for part_names in quirk.parts.values():
            for entry in part_names:
                assert re.fullmatch(r"[\w.]+:[\w.]+(\([\w, ]*\))?", entry), f"{quirk.id}: PARTS entry {entry!r}"
                assert entry.partition(":")[0] in quirk.targets, f"{quirk.id}: {entry!r} is not in one of its TARGETS"
        for part, versions in quirk.part_releases.items():
            assert part in quirk.parts and SpecifierSet(versions) is not None, f"{quirk.id}: PART_RELEASES {part!r}"
        declared_apart = "VERIFIED" in vars(quirk.module)
        upper = any(spec.operator in ("<", "<=") for spec in SpecifierSet(quirk.versions))
        if declared_apart and upper:
            assert quirk.fixed_by, (
                f"{quirk.id}: VERSIONS {quirk.versions} has an upper bound: FIXED_BY says what fixed it"
            )
        if quirk.fixed_by:
            assert upper, f"{quirk.id}: FIXED_BY without an upper bound in VERSIONS"
        for variable in quirk.settings:
            assert variable.name.startswith("NRL_") and variable.accepted and variable.meaning
        names = [v.name for q in registry.quirks() for v in q.settings if q.id != quirk.id]
        assert not {v.name for v in quirk.settings} & set(names), "a setting already declared by another quirk"

    def test_targets_imported_before_activation(self, quirk_module: str) -> None:
        quirk = self._quirk(quirk_module)
        self._applicable(quirk)
        out = self._contract_result(quirk, "before")
        if not out["targets"]:  # a fix for modules this release doesn't have (yet, or any more)
            pytest.skip(f"{quirk.id}: none of its targets {list(quirk.targets)} exists in this release")
        assert out["patched"] == sorted(out["targets"])  # every target patched, once
        for label, entry in out["wrapped"].items():
            assert entry["layers"] == 1, (label, entry)  # activate() twice: still one layer
            if "pickles" in entry:
                assert entry["pickles"] is True, (label, entry)
                assert entry["signature_kept"] in (True, "no signature"), (label, entry)
        assert all(out["restored"].values()), out["restored"]  # deactivate() puts every original back
        assert all(out["over_other_tool"].values()), out["over_other_tool"]
        assert all(out["other_tool_kept"].values()), out["other_tool_kept"]

    def test_targets_imported_after_activation(self, quirk_module: str) -> None:
        quirk = self._quirk(quirk_module)
        self._applicable(quirk)
        out = self._contract_result(quirk, "after")
        assert out["patched"] == sorted(out["targets"])
        assert all(count == 1 for count in out["layers"].values()), out["layers"]

    def test_pre_targets_run_before_the_module_executes(self, quirk_module: str) -> None:
        # PRE_TARGETS hooks (a fix that must be in place before a module's own code runs, e.g. a missing name it
        # imports): each runs before its module executes, what it returns runs right after, and patch() still follows.
        quirk = self._quirk(quirk_module)
        if not getattr(quirk.module, "PRE_TARGETS", None):
            pytest.skip(f"{quirk.id}: no PRE_TARGETS")
        self._applicable(quirk)
        for name, before in quirk.module.PRE_TARGETS.items():
            assert name in quirk.targets and callable(before), (quirk.id, name)
        proc = subprocess.run(
            [sys.executable, "-m", "nrl_shim.testing.pre_target_order", quirk.id],
            env=self.child_env(),
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

    def test_setup_is_undone_by_teardown(self, quirk_module: str) -> None:
        # Whatever setup() installs at activation (import-system entries, exported variables) is there once however
        # often activation runs, and deactivation takes it away again.
        quirk = self._quirk(quirk_module)
        if quirk.setup_argv is None:
            pytest.skip(f"{quirk.id}: no setup()")
        out = run_contract_child("setup", [quirk.id], self.child_env())[quirk.id]
        assert out["once"], out
        assert out["restored"], out


def pytest_generate_tests(metafunc: Any) -> None:
    """The plugin's one hook: each QuirkContract test runs once per listed quirk module, named by the module (the
    built-in ones by their path under nrl_shim.quirks, library first: `-k sglang` selects SGLang's)."""
    cls = metafunc.cls
    if cls is not None and issubclass(cls, QuirkContract) and "quirk_module" in metafunc.fixturenames:
        modules = list(cls.quirk_modules)
        metafunc.parametrize("quirk_module", modules, ids=[m.removeprefix("nrl_shim.quirks.") for m in modules])
