"""A fix's optional parts (PARTS, registry.py): names only one part of a fix relies on, checked on every release at the
target's import. A part lacking one: one WARNING at start-up naming the fix, the part and the name; the fix still acts;
its own code asks registry.missing_part() where the case happens; doctor shows "acts, part missing" and `--strict` exits
3 naming it. A test quirk on `packaging` (installed wherever nrl-shim is) and a target module made here;
tests/test_vllm_layerwise_refit_part_missing.py does it on a real vLLM release."""

import importlib
import logging
import sys
import types

import pytest

from nrl_shim import activation, cli, registry, report
from nrl_shim.errors import RefitIncompleteError

from conftest import fresh_activation

PART = "calls in a row"


def quirk_module(**declared):
    module = types.ModuleType("parts_quirk")

    def patch(target, settings):
        target.patched = True
        target.settings = settings

    def case(target):
        """The fix's own code where the case its part covers happens: named then (strict: an error)."""
        missing = registry.missing_part("test-parts", PART)
        if missing is None:
            return "covered"
        message = f"[test-parts] two calls in a row: {PART} is not covered on this release (missing: {missing})"
        if target.settings.strict:
            raise RefitIncompleteError(message)
        report.warn_once("test-parts", PART, message)
        return "named"

    module.__dict__.update(
        ID="test-parts",
        SUMMARY="a test quirk with an optional part",
        LINK="https://example.invalid/fix",
        LIBRARY="packaging",
        VERSIONS=">=1",
        TARGETS=("parts_target",),
        PARTS={PART: ("parts_target:Engine.step", "parts_target:hook(layer, info)")},
        patch=patch,
        unpatch=lambda target: vars(target).pop("patched", None),
        case=case,
    )
    module.__dict__.update(declared)
    return module


class Engine:
    def step(self):
        pass


def target(**names):
    module = types.ModuleType("parts_target")
    module.__dict__.update(names)
    return module


@pytest.fixture
def active(monkeypatch):
    """activation's state for one in-process _apply, nothing reported yet; the `nrl_shim` records collected."""
    fresh_activation(monkeypatch)
    monkeypatch.setattr(report, "_seen", set())
    monkeypatch.setattr(registry, "_MISSING_PARTS", {})
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    report.logger().addHandler(handler)
    yield records
    report.logger().removeHandler(handler)


def hook(layer, info):
    pass


def test_parts_are_read_and_checked_by_the_requires_syntax():
    quirk = registry.Quirk(quirk_module())
    assert quirk.parts == {PART: ("parts_target:Engine.step", "parts_target:hook(layer, info)")}
    assert quirk.missing_parts(target(Engine=Engine, hook=hook)) == {}
    assert quirk.missing_parts(target(Engine=Engine, hook=lambda layer, other: None)) == {
        PART: ["parts_target:hook(layer, info)"]
    }
    assert quirk.missing_parts(target()) == {PART: ["parts_target:Engine.step", "parts_target:hook(layer, info)"]}
    assert quirk.missing_parts(types.ModuleType("another_module")) == {}  # names of other targets: checked there
    assert registry.Quirk(quirk_module(PARTS={})).parts == {}


def test_a_part_is_checked_only_on_the_releases_its_part_releases_name():
    # PART_RELEASES: a hook upstream added in some release is expected from there; before it, its absence is how that
    # release is (no case to cover), never a warning. `packaging` is the test quirk's LIBRARY (installed: >= 21).
    module = target(Engine=Engine)  # `hook` absent
    expected_here = registry.Quirk(quirk_module(PART_RELEASES={PART: ">=1"}))
    assert expected_here.missing_parts(module) == {PART: ["parts_target:hook(layer, info)"]}
    not_yet = registry.Quirk(quirk_module(PART_RELEASES={PART: ">=1000"}))
    assert not_yet.part_releases == {PART: ">=1000"} and not_yet.missing_parts(module) == {}


def test_a_missing_part_never_withdraws_the_fix_on_an_unverified_release(active):
    # A release newer than those verified: REQUIRES are checked and, lacking, withdraw the whole fix; a part's names
    # are not REQUIRES: the rest of the fix acts, one WARNING names the part (vllm-layerwise-refit's CPU prepack hook
    # gone leaves the GPU reload on).
    quirk = registry.Quirk(quirk_module(VERIFIED="<1", REQUIRES=("parts_target:Engine.step",)))
    module = target(Engine=Engine)  # the part's `hook` gone, what REQUIRES names there
    activation._apply(quirk, module)
    assert module.patched is True and ("test-parts", "parts_target") in activation._State.patched
    warnings = [r.getMessage() for r in active if r.levelno >= logging.WARNING]
    assert any("acts, but not for calls in a row" in w for w in warnings), warnings
    assert not any("fix skipped" in w for w in warnings), warnings


def test_a_part_present_says_nothing_and_covers_the_case(active):
    quirk = registry.Quirk(quirk_module())
    module = target(Engine=Engine, hook=hook)
    activation._apply(quirk, module)
    assert module.patched is True and [r for r in active if r.levelno >= logging.WARNING] == []
    assert registry.missing_part("test-parts", PART) is None
    assert quirk.module.case(module) == "covered"


def test_a_missing_part_warns_once_at_import_and_the_fix_still_acts(active):
    quirk = registry.Quirk(quirk_module())
    module = target(Engine=Engine)  # `hook` gone on this release
    activation._apply(quirk, module)
    activation._apply(quirk, module)  # a reload: checked again, said once
    assert module.patched is True and ("test-parts", "parts_target") in activation._State.patched
    (warning,) = [r for r in active if r.levelno >= logging.WARNING]
    assert warning.levelno == logging.WARNING
    assert warning.getMessage() == (
        f"[test-parts] acts, but not for {PART} on this release: parts_target lacks parts_target:hook(layer, info); "
        "when that case happens it is named then (an error in strict mode)"
    )
    assert registry.missing_part("test-parts", PART) == "parts_target:hook(layer, info)"
    assert registry.missing_part("test-parts", "another part") is None
    # The case happens: named then, at WARNING (never INFO), once.
    assert quirk.module.case(module) == "named"
    quirk.module.case(module)
    named = [r for r in active if "two calls in a row" in r.getMessage()]
    assert len(named) == 1 and named[0].levelno == logging.WARNING
    assert "(missing: parts_target:hook(layer, info))" in named[0].getMessage()
    assert not [r for r in active if r.levelno == logging.INFO and PART in r.getMessage()]


def test_strict_mode_warns_at_import_and_raises_when_the_case_happens(active, monkeypatch):
    monkeypatch.setattr(activation._State, "settings", registry.load_settings({"NRL_SHIM_STRICT": "1"}))
    quirk = registry.Quirk(quirk_module())
    module = target()
    activation._apply(quirk, module)  # no error at start-up: a job may never meet the case
    assert module.patched is True
    assert [r.levelno for r in active] == [logging.WARNING]
    with pytest.raises(RefitIncompleteError, match=r"missing: parts_target:Engine.step, parts_target:hook"):
        quirk.module.case(module)


def test_doctor_shows_a_missing_part_and_strict_exits_3_naming_it(active, monkeypatch, capsys):
    quirk = registry.Quirk(quirk_module())
    monkeypatch.setitem(sys.modules, "parts_target", target(Engine=Engine))
    monkeypatch.setattr(registry, "quirks", lambda: (quirk,))
    monkeypatch.setattr(
        cli, "_env_activation_status", lambda: {"pth": None, "working": True, "detail": "not checked here"}
    )
    entry = cli._quirk_entry(quirk, registry.load_settings({}))
    assert entry["status"] == cli.PART_MISSING and entry["missing_parts"] == {PART: ["parts_target:hook(layer, info)"]}
    assert entry["reason"].endswith(f"; part missing: {PART} not covered (missing: parts_target:hook(layer, info))")
    assert cli.doctor() == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "acts, part missing" in out and f"part missing: test-parts ({PART}) (--strict makes that exit 3)" in out
    assert "1 of 1 fixes act" in out
    assert cli.doctor(strict=True) == cli.EXIT_STRICT
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict == f"verdict: a part of a fix is missing here (exit 3, --strict): test-parts ({PART})"
    # All there: acts, verified; --strict passes.
    monkeypatch.setitem(sys.modules, "parts_target", target(Engine=Engine, hook=hook))
    assert cli._quirk_entry(quirk, registry.load_settings({}))["status"] == cli.APPLIES
    assert cli.doctor(strict=True) == cli.EXIT_OK


def test_doctor_names_no_part_whose_module_the_release_does_not_ship(monkeypatch):
    """A module the release lacks altogether is one no job imports (nor checks): no part is named missing for it, as
    vllm-layerwise-refit's reload hooks on a vLLM before its layerwise reload. One whose own import fails is still."""
    quirk = registry.Quirk(quirk_module())
    monkeypatch.delitem(sys.modules, "parts_target", raising=False)
    monkeypatch.setattr(
        cli, "_env_activation_status", lambda: {"pth": None, "working": True, "detail": "not checked here"}
    )
    assert cli._quirk_entry(quirk, registry.load_settings({}))["status"] == cli.APPLIES

    real_import = importlib.import_module

    def broken(name, *args, **kwargs):
        if name == "parts_target":
            raise ModuleNotFoundError("No module named 'parts_dependency'", name="parts_dependency")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", broken)
    entry = cli._quirk_entry(quirk, registry.load_settings({}))
    assert entry["status"] == cli.PART_MISSING and "parts_dependency" in entry["missing_parts"][PART][0]
