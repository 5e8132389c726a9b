"""sglang-release-resume-idempotent on a real SGLang HTTP server started with `--enable-memory-saver` (the shared runs,
tests/sglang_runs.py, RELEASE_AGAIN_CASES at their end): the weights released twice, resumed, refilled by an update
from disk, the prompt; the KV cache released alone and every tag resumed, the prompt; a resume with nothing released,
the prompt.

Without the shim the resume of tags never released raises KeyError in the scheduler and the server is gone. The
second release is harmless here: the test harness's torch_memory_saver stand-in (tests/sglang_cpu) leaves paused
memory readable, and the prompt after the resume and refit is right either way; with the real one that release
stashes the model's buffers from unmapped memory (read in SGLang's and torch_memory_saver's source, not run: no CUDA).
Under the shim each call leaves out the tags already in the state it asks for, one WARNING per call kind, and every
prompt comes out as transformers gives it.
"""

import pytest

from sglang_helpers import REAL_SGLANG, logprob_gap
from sglang_runs import down_at, references, server_run

pytestmark = REAL_SGLANG
ID = "sglang-release-resume-idempotent"


def _lines(run):
    return [line for line in run["shim_lines"] if f"[{ID}]" in line]


def _served_a(result):
    return result.get("tokens") == references()["A"]["tokens"] and logprob_gap(result, references()["A"]) < 1e-3


def test_a_resume_of_tags_not_released_kills_the_server_without_the_shim():
    run = server_run(False)
    results = run["results"]
    if down_at(run, "release_first"):  # up to 0.5.21 the server without the shim died at a refused flush before
        pytest.skip(f"the server without the shim died before (SGLang {run['sglang']}): {run['died']}")
    assert [results[name]["status"] for name in ("release_first", "release_again", "resume_after_release_again")] == [
        200,
        200,
        200,
    ], results
    assert results["update_after_release_again"]["body"]["success"], results["update_after_release_again"]
    assert _served_a(results["after_release_again"]), results["after_release_again"]  # harmless on the CPU (above)
    assert down_at(run, "after_resume_all"), results["after_resume_all"]  # the resume of all tags took it down
    assert run["died"] is not None and "KeyError" in run["log_tail"], run["log_tail"]
    assert not _lines(run)


def test_each_tag_is_released_and_resumed_once_under_the_shim():
    run = server_run(True)
    results = run["results"]
    assert run["died"] is None, run["log_tail"]
    for name in (
        "release_first",
        "release_again",
        "resume_after_release_again",
        "release_kv_only",
        "resume_all_after_kv",
        "resume_unreleased",
    ):
        assert results[name]["status"] == 200, (name, results[name])
    assert results["update_after_release_again"]["body"]["success"], results["update_after_release_again"]
    # the buffers stashed at the first release came back: after the refit the prompt is A's
    assert _served_a(results["after_release_again"]), results["after_release_again"]
    # the KV cache resumed, the weights (never released) left alone
    assert _served_a(results["after_resume_all"]), results["after_resume_all"]
    # nothing released: answered success, nothing touched
    assert _served_a(results["after_resume_unreleased"]), results["after_resume_unreleased"]
    warnings = [line for line in _lines(run) if "WARNING" in line]
    assert len(warnings) == 2, _lines(run)  # one per call kind and process (one scheduler here)
    release, resume = sorted(warnings, key=lambda line: "resume_memory_occupation asked" in line)
    assert "release_memory_occupation asked for" in release and "answered success" in release, release
    assert "resume_memory_occupation asked for" in resume and "went on with ['kv_cache']" in resume, resume
