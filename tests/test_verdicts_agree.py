"""One verdict per fix (registry.verdict): activation gates each fix with it at every target import, doctor shows it;
in every release venv this suite runs in, after a job's imports, the two say the same state for every fix activation
gated. tests/children/verdicts_agree.py does the imports in a fresh interpreter with the shim active. The unit venvs
have none of the fixes' libraries: nothing is gated there, the test skips naming that."""

import importlib.util

import pytest

from conftest import run_child_json


def _agree(libraries=(), env=None):
    out, _ = run_child_json("verdicts_agree", *libraries, env={"NRL_SHIM": "1", **(env or {})}, timeout=600)
    if not out["compared"]:
        pytest.skip(f"no fix's target imports here ({out['not_imported']} target modules not importable)")
    disagree = {quirk_id: states for quirk_id, states in out["compared"].items() if states[0] != states[1]}
    assert not disagree, disagree
    return out


def test_activation_and_doctor_give_each_fix_the_same_verdict():
    out = _agree(("vllm", "torch", "transformers", "ray"))
    # Where vLLM is installed, its fixes that act here were gated at their targets' import.
    states = {states[0] for states in out["compared"].values()}
    assert states <= {"applies", "unverified", "part-missing", "idle", "not-affected", "fixed-upstream", "skipped",
                      "out-of-range"}, states  # fmt: skip


@pytest.mark.sglang
def test_activation_and_doctor_give_each_sglang_fix_the_same_verdict():
    # Found, not imported: SGLang imports only with the CPU harness (tests/sglang_cpu), which the child has, not pytest
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed in this interpreter")
    from sglang_helpers import sglang_env

    out = _agree(("sglang",), env=sglang_env())
    assert {quirk_id for quirk_id in out["compared"]} >= {"sglang-radix-cache-refit", "sglang-trainer-logprobs"}, out
