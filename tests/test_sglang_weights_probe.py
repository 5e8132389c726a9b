"""sglang-weights-probe on a real SGLang engine (`sglang.Engine`, CPU; the run sglang_runs.engine_run shares with
tests/test_sglang_engine.py): a sync and a re-sync of a policy's weights give no finding; a checkpoint reloaded from
disk over them (verl's and AReaL's disk route pointed at the starting checkpoint: TRL#5312's shape on SGLang) is
served with SGLang's success, the starting checkpoint's tokens again (the failure, in both runs), and under the shim
named once, at the scheduler's next batch. The run under the shim is in CI; the one without it in `nox -t full`.
The mechanism: tests/test_probe_weights.py; vLLM's: tests/test_vllm_weights_probe.py.
"""

import sys

import pytest

from sglang_helpers import REAL_SGLANG
from sglang_runs import engine_run, references

ID = "sglang-weights-probe"
pytestmark = REAL_SGLANG


@pytest.fixture(scope="module", params=[pytest.param(False, marks=pytest.mark.full), True], ids=["plain", "shim"])
def run(request):
    out = engine_run(request.param)
    lines = [line for line in out["stderr"].splitlines() if f"[{ID}]" in line]
    print(f"probe lines ({'shim' if request.param else 'plain'}): {lines}", file=sys.stderr)
    return {"shim": request.param, "results": out["results"], "lines": lines}


def test_a_checkpoint_reloaded_over_the_sync_is_served(run):
    results, reference = run["results"], references()
    assert results["after_resync"]["tokens"] == reference["B"]["tokens"], results["after_resync"]  # the sync served
    assert all(step[0] for step in results["resync"].values()), results["resync"]
    assert results["reload"]["update"][0], results["reload"]  # SGLang answers success
    assert results["after_reload"]["tokens"] == reference["A"]["tokens"], results["after_reload"]  # A's tokens again


def test_the_probe_names_the_reload_once_and_nothing_before_it(run):
    warnings = [line for line in run["lines"] if "WARNING" in line and "weights vs the refit" in line]  # findings
    if not run["shim"]:
        assert run["lines"] == []
        return
    assert len(warnings) == 1, run["lines"]  # the two updates of B say nothing; the reload is named once
    assert "refit 3 left the weights exactly as they were when loaded at start-up" in warnings[0], warnings
    assert "TP rank 0" in warnings[0]
