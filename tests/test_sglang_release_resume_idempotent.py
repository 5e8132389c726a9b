"""sglang-release-resume-idempotent on a real SGLang HTTP server started with `--enable-memory-saver` (the shared runs,
tests/sglang_runs.py, RELEASE_AGAIN_CASES at their end): the weights released twice, resumed, refilled by an update
from disk, the prompt; the KV cache released alone and every tag resumed, the prompt; a resume with nothing released,
the prompt.

Without the shim the second release stashes the model's non-parameter buffers (the rotary tables) again from the
paused memory, which the test harness's torch_memory_saver stand-in zeroes (tests/sglang_cpu; the real one unmaps it),
and the resume restores those: after the refit the prompt's tokens are not the weights' (the refit sends parameters
only); then the resume of tags never released raises KeyError in the scheduler and the server is gone. Under the shim
each call leaves out the tags already in the state it asks for, one WARNING per call kind, and every prompt comes out
as transformers gives it.
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


def test_release_twice_then_resume_serves_wrong_tokens_and_a_resume_of_unreleased_tags_kills_the_server():
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
    after = results["after_release_again"]
    assert after["status"] == 200 and after["tokens"] != references()["A"]["tokens"], after  # no error, wrong tokens
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
