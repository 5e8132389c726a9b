"""sglang-weightless-resume-guard on a real SGLang HTTP server started with `--enable-memory-saver` (the shared runs,
tests/sglang_runs.py): `/release_memory_occupation`, `/resume_memory_occupation` with no CPU backup, a greedy request
before the refit, the refit, a request after it. Without the shim the request before the refit is served from the
empty weights (status 200, eight times token 0 here), nothing said; under the shim one WARNING names it (the request
still served: the job is not broken), and after the refit everything is as transformers gives it.

torch_memory_saver itself needs CUDA: tests/sglang_cpu/torch_memory_saver.py stands in for it (what its pause and
resume leave in the tensors of a region, with and without a backup); gpu/sglang_weightless_resume.py runs the same
sequence on a GPU with the real one. `nox -t full`: strict mode (the request aborted with the guard's error, the server
goes on) and `--enable-weights-cpu-backup` (the weights come back; one INFO line: nothing for the guard to do).
"""

import pytest

from sglang_helpers import REAL_SGLANG
from sglang_runs import references, server_run

pytestmark = REAL_SGLANG
ID = "sglang-weightless-resume-guard"
SEQUENCE = (
    "first",
    "settle_before_release",
    "release",
    "resume",
    "after_resume",
    "settle_after_resume",
    "update_after_resume",
    "after_resume_update",
)


def _guard_lines(run, level=""):
    return [line for line in run["shim_lines"] if f"[{ID}]" in line and level in line]


def _resumed(run):
    results = run["results"]
    assert results["release"]["status"] == 200 and results["resume"]["status"] == 200, results
    return results


def test_resume_without_backup_serves_empty_weights_without_the_shim():
    run = server_run(False)
    after = _resumed(run)["after_resume"]
    assert after["status"] == 200, after  # served, no error
    assert after["tokens"] != references()["B"]["tokens"], after  # not the weights the server held
    assert not _guard_lines(run)


def test_resume_without_backup_named_under_the_shim():
    run = server_run(True)
    after = _resumed(run)["after_resume"]
    assert after["status"] == 200, after  # the guard names the request, it does not refuse it (not strict)
    warnings = _guard_lines(run, "WARNING")
    assert len(warnings) == 1 and "came back empty" in warnings[0], run["shim_lines"]  # one, before the refit only
    assert any("resumed without their contents" in line for line in _guard_lines(run, "INFO")), run["shim_lines"]


def test_refit_after_resume_serves_the_new_weights():
    for shim in (False, True):
        after = server_run(shim)["results"]["after_resume_update"]
        assert after["tokens"] == references()["B"]["tokens"], (shim, after)


@pytest.mark.full
def test_strict_aborts_the_request_and_the_server_goes_on():
    run = server_run(True, names=SEQUENCE, env=(("NRL_SHIM_STRICT", "1"),))
    after = _resumed(run)["after_resume"]
    assert after["status"] == 400 and ID in str(after["body"]), after
    assert run["results"]["after_resume_update"]["tokens"] == references()["B"]["tokens"], run["results"]
    assert run["died"] is None


@pytest.mark.full
def test_cpu_backup_brings_the_weights_back_and_the_guard_stays_idle():
    run = server_run(True, args=("--enable-weights-cpu-backup",), names=SEQUENCE)
    after = _resumed(run)["after_resume"]
    assert after["tokens"] == references()["A"]["tokens"], after  # the weights A held before the release
    lines = _guard_lines(run)
    assert len(lines) == 1 and "nothing to change" in lines[0] and "CPU backup" in lines[0], run["shim_lines"]
