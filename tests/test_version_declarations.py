"""The version declaration of a fix (registry.py): where its bug exists (VERSIONS, FIXED_BY), where it was verified
(VERIFIED), what it touches (REQUIRES, check()); and what activation, doctor and the job report make of it. No vLLM
or torch: the library a test quirk is about is `packaging` (installed wherever nrl-shim is), its release compared
with ranges drawn around the installed one. tests/test_version_policy.py does it on real vLLM and torch releases."""

import logging
import types

import pytest
from packaging.version import Version

from nrl_shim import activation, cli, job_report, registry
from nrl_shim.libraries import find

from conftest import fresh_activation

UNVERIFIED = "] acts on an unverified release: "

INSTALLED = Version(find("packaging").version)
BELOW, ABOVE = f"{INSTALLED.major}", f"{INSTALLED.major + 1}"  # an upper bound the installed release is past / under


def quirk_module(**declared):
    module = types.ModuleType("version_declarations_quirk")
    module.__dict__.update(
        ID="test-versions",
        SUMMARY="a test quirk",
        LINK="https://example.invalid/fix",
        LIBRARY="packaging",
        VERSIONS=">=1",
        TARGETS=("target_module",),
        patch=lambda module, settings: setattr(module, "patched", True),
        unpatch=lambda module: vars(module).pop("patched", None),
    )
    module.__dict__.update(declared)
    return module


def target(**names):
    module = types.ModuleType("target_module")
    module.__dict__.update(names)
    return module


def test_a_module_with_only_versions_is_verified_where_it_applies():
    # The declaration before VERIFIED existed (and other packages' quirks): bug range = verified range.
    quirk = registry.Quirk(quirk_module(VERSIONS=f"<{ABOVE}"))
    assert quirk.verified == {"packaging": f"<{ABOVE}"} and quirk.gate()[0] is True
    assert quirk.unverified() is None and quirk.requires == () and quirk.fixed_by is None
    outside = registry.Quirk(quirk_module(VERSIONS=f"<{BELOW}"))  # past its range: skipped, as before
    applies, version, reason = outside.gate()
    assert not applies and version == str(INSTALLED) and "outside the supported range" in reason


def test_a_release_newer_than_verified_is_named_with_what_was_verified():
    quirk = registry.Quirk(quirk_module(VERIFIED=f">=1,<{BELOW}"))
    assert quirk.gate()[0] is True
    assert quirk.unverified() == (
        f"packaging {INSTALLED} is newer than the releases it was verified on (packaging>=1,<{BELOW})"
    )
    # VERIFIED as a mapping covers ALSO_REQUIRES' libraries too; each unverified one is named.
    both = registry.Quirk(
        quirk_module(ALSO_REQUIRES={"wrapt": ">=1"}, VERIFIED={"packaging": f"<{ABOVE}", "wrapt": "<1"})
    )
    assert both.verified == {"packaging": f"<{ABOVE}", "wrapt": "<1"}
    assert both.unverified().startswith("wrapt ") and "(wrapt<1)" in both.unverified()


def test_past_the_upstream_fix_there_is_nothing_to_fix():
    quirk = registry.Quirk(quirk_module(VERSIONS=f">=1,<{BELOW}", FIXED_BY="https://example.invalid/pr/1"))
    applies, version, reason = quirk.gate()
    assert (applies, version) == (False, None)  # as for a library not installed: no warning, never a strict error
    assert (
        reason
        == f"packaging {INSTALLED} has the upstream fix (from {BELOW}: https://example.invalid/pr/1); nothing to fix"
    )
    assert registry.Quirk(quirk_module(VERSIONS=f">=1,<{ABOVE}", FIXED_BY="x")).gate()[0] is True


class Engine:
    def generate(self, prompt, params, request_id, *, extra=None):
        pass


def test_requires_names_what_is_missing_exactly():
    quirk = registry.Quirk(
        quirk_module(
            REQUIRES=(
                "target_module:Engine.generate(prompt, params, request_id)",
                "target_module:Engine.reset",
                "target_module:helper",
                "other_module:Anything",  # another target's: checked when that one is imported
            )
        )
    )
    assert quirk.missing(target(Engine=Engine, helper=len)) == ["target_module:Engine.reset"]
    assert quirk.missing(target()) == [
        "target_module:Engine.generate(prompt, params, request_id)",
        "target_module:Engine.reset",
        "target_module:helper",
    ]
    renamed = type("Engine", (), {"generate": lambda self, prompt, sampling_params, request_id: None, "reset": None})
    assert quirk.missing(target(Engine=renamed, helper=len)) == [
        "target_module:Engine.generate(prompt, params, request_id)"
    ]


def test_check_hook_adds_what_it_found_missing_and_a_failing_check_says_so():
    def check(module):
        return None if hasattr(module, "marker") else "the marker in target_module"

    quirk = registry.Quirk(quirk_module(check=check))
    assert quirk.missing(target(marker=1)) == []
    assert quirk.missing(target()) == ["the marker in target_module"]
    broken = registry.Quirk(quirk_module(check=lambda module: 1 / 0))
    assert broken.missing(target()) == ["its check of target_module failed: ZeroDivisionError: division by zero"]


def test_doctor_skips_a_required_module_the_release_does_not_ship_beside_one_it_does():
    """REQUIRES naming a handler in either of two modules (it moved between releases): the module a release lacks is
    one no job imports, so the verdict checks the other; a release lacking both, or one whose module is there and
    broken, is skipped with what is missing."""
    quirk = registry.Quirk(
        quirk_module(VERIFIED=f"<{BELOW}", REQUIRES=("target_module:helper", "moved_module:Owner.helper"))
    )
    gone = ModuleNotFoundError("No module named 'moved_module'", name="moved_module")
    found = registry.verdict(quirk, None, {"target_module": target(helper=len), "moved_module": gone})
    assert found.state == registry.UNVERIFIED, found
    both_gone = {"target_module": ModuleNotFoundError("no", name="target_module"), "moved_module": gone}
    assert registry.verdict(quirk, None, both_gone).state == registry.SKIPPED
    broken = ModuleNotFoundError("No module named 'its_dependency'", name="its_dependency")
    found = registry.verdict(quirk, None, {"target_module": target(helper=len), "moved_module": broken})
    assert found.state == registry.SKIPPED and "moved_module" in found.reason, found


@pytest.fixture
def active(monkeypatch):
    """activation's state for one in-process _apply: active, default settings, nothing gated or reported yet."""
    fresh_activation(monkeypatch)
    from nrl_shim import report

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    report.logger().addHandler(handler)

    def said():
        return [r.getMessage() for r in records]

    said.records = records  # the LogRecords themselves: their kind is what the job report reads
    yield said
    report.logger().removeHandler(handler)


def test_unverified_fix_acts_when_its_checks_pass_and_says_so_once(active):
    quirk = registry.Quirk(quirk_module(VERIFIED=f"<{BELOW}", REQUIRES=("target_module:helper",)))
    module = target(helper=len)
    activation._apply(quirk, module)
    activation._apply(quirk, module)  # a reload: patched again, said once
    assert module.patched is True
    notices = [m for m in active() if UNVERIFIED in m]
    assert notices == [
        f"[test-versions] acts on an unverified release: packaging {INSTALLED} is newer than the releases it was "
        f"verified on (packaging<{BELOW}); 1 name(s) it relies on checked"
    ]
    (record,) = [r for r in active.records if UNVERIFIED in r.getMessage()]
    assert job_report.kind_of(record) == "unverified" and job_report.quirk_of(record, "") == "test-versions"


def test_unverified_fix_lacking_a_part_skips_naming_it_and_undoes_its_other_targets(active, monkeypatch):
    other = types.ModuleType("other_module")
    quirk = registry.Quirk(
        quirk_module(
            VERIFIED=f"<{BELOW}",
            TARGETS=("other_module", "target_module"),
            REQUIRES=("target_module:helper",),
        )
    )
    monkeypatch.setitem(__import__("sys").modules, "other_module", other)
    activation._apply(quirk, other)
    assert other.patched is True
    module = target()
    activation._apply(quirk, module)
    assert not hasattr(module, "patched") and not hasattr(other, "patched")  # acts nowhere rather than half
    skipped = [m for m in active() if "fix skipped" in m]
    assert len(skipped) == 1 and skipped[0].endswith("target_module lacks what it needs: target_module:helper"), skipped
    activation._apply(quirk, other)  # a later import of a target: still skipped, no second warning
    assert not hasattr(other, "patched") and len([m for m in active() if "fix skipped" in m]) == 1


def test_a_target_still_executing_is_not_checked_until_it_finished(active, monkeypatch):
    # vLLM's arg_utils imports argparse_utils half-way through its own code: when argparse_utils (also a target) is
    # patched, arg_utils is in sys.modules without the names defined below that import. Checked then, a release past
    # VERIFIED would lose the fix for names that are there (found on vLLM relabeled 0.34.0: tests/test_version_policy.py).
    import importlib.machinery
    import sys

    quirk = registry.Quirk(
        quirk_module(
            VERIFIED=f"<{BELOW}", TARGETS=("other_module", "target_module"), REQUIRES=("target_module:helper",)
        )
    )
    executing = target()  # `helper` not defined yet
    executing.__spec__ = importlib.machinery.ModuleSpec("target_module", None)
    executing.__spec__._initializing = True  # what importlib sets while a module's code runs
    monkeypatch.setitem(sys.modules, "target_module", executing)
    other = types.ModuleType("other_module")
    activation._apply(quirk, other)  # imported by target_module on its way
    assert other.patched is True and not [m for m in active() if "fix skipped" in m]
    executing.helper, executing.__spec__._initializing = len, False  # target_module finished
    activation._apply(quirk, executing)
    assert executing.patched is True and other.patched is True
    # Finished and lacking it: the fix is withdrawn from both.
    executing.__dict__.pop("helper")
    monkeypatch.setattr(activation._State, "releases", {})
    activation._apply(quirk, types.ModuleType("other_module"))
    assert not hasattr(executing, "patched") and [m for m in active() if "lacks what it needs" in m]


def test_strict_mode_refuses_only_the_skip(active, monkeypatch):
    from nrl_shim.errors import QuirkSkippedError

    monkeypatch.setattr(activation._State, "settings", registry.load_settings({"NRL_SHIM_STRICT": "1"}))
    quirk = registry.Quirk(quirk_module(VERIFIED=f"<{BELOW}", REQUIRES=("target_module:helper",)))
    activation._apply(quirk, target(helper=len))  # unverified, its checks pass: acts
    with pytest.raises(QuirkSkippedError, match="target_module:helper"):
        activation._apply(quirk, target())


def test_doctor_verdict_counts_the_fixes_that_act():
    states = ["applies", "applies", "unverified", "idle", "skipped", "fixed-upstream", "not-installed"]
    assert cli._tally([{"status": s} for s in states]) == "3 of 7 fixes act (1 on a release newer than those verified)"
    assert cli._tally([{"status": "applies"}, {"status": "idle"}]) == "1 of 2 fixes act"
