"""sglang-radix-cache-refit on a real SGLang HTTP server (tests/sglang_runs.py: one server without the shim, one
with it, the same cases in one order), the route every RL framework's SGLang server takes:
- `update_weights_from_disk(flush_cache=False)` (as NeMo RL and slime send each bucket), then a prompt served before:
  without the shim it comes from the old weights' KV; with it, exact to transformers with the new weights, and the
  next request with that prompt shares the new prefix at once;
- 4 requests decoding, the generation paused in place (slime's, verl's way), an update with SGLang's flush: refused
  (0.5.22+: the update fails "cache was not flushed", and the prompt served before still comes from the old KV;
  up to 0.5.21 the scheduler asserts and the server dies); with the shim the update succeeds, the 4 requests finish,
  and the prompt comes from the new weights;
- an update without flush, then the caller's own flush while 4 requests run (NeMo RL's `invalidate_kv_cache`: one GET,
  anything but a 200 raises; its refit's loop retries 60 s): without the shim 400 "Flush cache failed."; with it 200 at
  once, the 4 requests finish, the prompt served before comes from the new weights; after a flush that went through
  (the caller's, an update's own), the same flush while requests run gets SGLang's own 400 (nothing of earlier weights
  to keep out).
- 4 requests decoding, the generation paused in SGLang's `retract` mode (back to the waiting queue, no KV slot), an
  update without flush, the generation continued: without the shim each request's second prefill is served its
  prompt's KV of the old weights (69-79 of its last 100 tokens not the new weights' greedy choice); with it, none;
- a trainer's broadcast (update_weights_from_distributed over gloo) without flush: counted;
- 0.5.21+: a weight-update session with no load in it, counted;
- the venv's site-packages hashed before and after the shared run under the shim: nothing written.
The Engine's update_weights_from_tensor route: tests/test_sglang_engine.py (`nox -t full`).
"""

import pytest

from conftest import run_child_json
from sglang_helpers import REAL_SGLANG, greedy_choices, logprob_gap, sglang_env
from sglang_runs import (
    PARALLEL,
    PROMPT,
    RETRACTED_PROMPTS,
    checkpoints,
    down_at,
    parallel_env,
    references,
    server_run,
)

ID = "sglang-radix-cache-refit"


def real_sglang(test):
    for mark in REAL_SGLANG:
        test = mark(test)
    return test


def test_versioned_key_keeps_the_requests_own_key_at_its_end():
    """The version goes in front: SGLang reads a LoRA id from the key's last 32 characters and appends its elastic
    namespace after a `|`; the request's own key comes back whole, None included."""
    from nrl_shim.quirks.sglang.radix_cache_refit import base_key, versioned_key

    lora = "a" * 32
    for key in (None, "", lora, f"salt{lora}|ns"):
        assert versioned_key(key, 0) == key
        for version in (1, 12):
            keyed = versioned_key(key, version)
            assert keyed != key and base_key(keyed) == key
            assert versioned_key(keyed, version + 1) == versioned_key(key, version + 1)  # re-keyed, not stacked
            if key:
                assert keyed.endswith(key)
    assert len({versioned_key(None, v) for v in (1, 2, 3)} | {None}) == 4


STALE = len(PROMPT) - 1  # the whole prompt but its last token (which is always computed) from the radix cache


@pytest.fixture(scope="module")
def plain():
    return server_run(False)


@pytest.fixture(scope="module")
def shim():
    return server_run(True)


def _stale(result, reference):
    return result.get("cached", 0) >= STALE and logprob_gap(result, reference) > 0.05


@real_sglang
def test_first_request_matches_transformers(plain, shim):
    for run in (plain, shim):
        first = run["results"]["first"]
        assert first["tokens"] == references()["A"]["tokens"], first
        assert logprob_gap(first, references()["A"]) < 1e-3 and first["cached"] == 0


@real_sglang
def test_update_without_flush_serves_old_kv_without_the_shim(plain):
    assert plain["results"]["update_b_no_flush"]["status"] == 200
    after = plain["results"]["after_update"]
    assert _stale(after, references()["B"]), after


@real_sglang
def test_update_without_flush_serves_new_weights_under_the_shim(shim):
    results = shim["results"]
    assert results["update_b_no_flush"]["status"] == 200
    after, follower = results["after_update"], results["follower"]
    assert after["cached"] == 0, after  # nothing of the old weights' KV
    assert after["tokens"] == references()["B"]["tokens"] and logprob_gap(after, references()["B"]) < 1e-3
    # the next request shares the prefix the first one computed with the new weights (no flush, no waiting for idle)
    assert follower["cached"] >= STALE, follower
    assert follower["tokens"] == references()["B"]["tokens"] and logprob_gap(follower, references()["B"]) < 1e-3
    assert any(f"[{ID}]" in line and "weight version 1" in line for line in shim["shim_lines"]), shim["shim_lines"]


@real_sglang
def test_nothing_is_written_under_site_packages(shim):
    """The shared run under the shim (every SGLang fix's cases on one server): the venv as installed after it."""
    assert shim["site_packages_changed"] == [], shim["site_packages_changed"]


@real_sglang
def test_refused_flush_fails_or_kills_the_server_without_the_shim(plain):
    update = plain["results"]["update_c_running"]
    after = plain["results"]["after_running_update"]
    if down_at(plain, "after_running_update"):  # up to 0.5.21: the scheduler's assert takes the server down
        assert "Cache flush failed after updating weights" in plain["log_tail"], plain["log_tail"]
        return
    # 0.5.22+: the update fails (a 200 here means the requests had finished before the pause: no refused flush)
    assert update["update"]["status"] != 200 and not update["update"]["body"]["success"], update
    assert "not flushed" in update["update"]["body"]["message"]
    assert all(update["finished"]), update
    assert _stale(after, references()["C"]), after  # KV of earlier weights for a prompt served before


@real_sglang
def test_refused_flush_under_the_shim(shim):
    update = shim["results"]["update_c_running"]
    assert shim["died"] is None
    assert update["update"]["status"] == 200 and update["update"]["body"]["success"], update
    assert all(update["finished"]), update  # the requests running at the update finish
    after = shim["results"]["after_running_update"]
    assert after["cached"] == 0, after
    assert after["tokens"] == references()["C"]["tokens"] and logprob_gap(after, references()["C"]) < 1e-3
    refused = [line for line in shim["shim_lines"] if f"[{ID}]" in line and "refused" in line]
    assert refused and "weight version 3" in refused[0], shim["shim_lines"]  # this run's third update


@real_sglang
def test_callers_flush_while_requests_run_fails_without_the_shim(plain):
    if down_at(plain, "after_running_update"):  # up to 0.5.21 the server died at the refused flush inside an update
        pytest.skip(f"the server without the shim died before (SGLang {plain['sglang']}): {plain['died']}")
    flush = plain["results"]["flush_running_after_update"]
    assert flush["flush"]["status"] == 400 and "Flush cache failed" in flush["flush"]["text"], flush
    assert all(flush["finished"]), flush


@real_sglang
def test_callers_flush_while_requests_run_under_the_shim(shim):
    results = shim["results"]
    flush = results["flush_running_after_update"]
    assert flush["flush"]["status"] == 200 and all(flush["finished"]), flush  # the running requests untouched
    after = results["after_flush_running"]
    # nothing of C's KV, the weights before (its first token is the running requests' own: computed with B)
    assert after["cached"] <= 1, after
    assert after["tokens"] == references()["B"]["tokens"] and logprob_gap(after, references()["B"]) < 1e-3
    said = [line for line in shim["shim_lines"] if f"[{ID}]" in line and "flush asked for while" in line]
    assert len(said) == 1 and "4 requests run or wait" in said[0], shim["shim_lines"]
    # a flush that went through, then the same flush while requests run: SGLang's own refusal (nothing to keep out)
    assert results["flush_idle"]["status"] == 200, results["flush_idle"]
    flushed = results["flush_running_flushed"]
    assert flushed["flush"]["status"] == 400 and all(flushed["finished"]), flushed
    # an update whose own flush went through: the same
    assert results["update_b_flushed"]["body"]["success"], results["update_b_flushed"]
    flushed = results["flush_running_update_flushed"]
    assert flushed["flush"]["status"] == 400 and all(flushed["finished"]), flushed


@real_sglang
def test_callers_flush_with_only_aborted_requests_left_gets_sglangs_answer():
    """SGLang's own flush handler and Req objects (tests/children/sglang_flush_handler.py: the moment between an abort
    and the step that finishes it, which a live server can't be held in): a running request, the flush answered
    success under the shim (refused without it); the only request left being aborted (slime's pause, then its flush
    before release_memory_occupation, which asserts an idle scheduler), SGLang's refusal either way: the caller's retry
    gets the real flush a step later."""
    for shim in (False, True):
        out, _ = run_child_json("sglang_flush_handler", env=sglang_env({"NRL_SHIM": "1" if shim else "0"}))
        answers = out["answers"]
        assert answers["running"][0] is shim, answers
        assert shim is ("nrl-shim keeps KV of weights before version 1 out" in answers["running"][1]), answers
        assert answers["aborting"] == [False, ""], answers


@real_sglang
def test_a_weight_update_session_without_a_load_is_counted(plain, shim):
    """0.5.21+: begin_weight_update, end_weight_update with no load between (the session of weights written in place
    by P2P/RDMA, SGLang's post-load step at its end). The write itself needs a GPU transport: here the weights stay B,
    so what this shows is the count: without the shim the prompt served before comes from the cache (299 tokens),
    with it from the new weight version (nothing cached), and the line names the route."""
    if shim["results"]["session_begin"]["status"] == 404:
        pytest.skip(f"SGLang {shim['sglang']} has no weight-update sessions (0.5.21+)")
    for run in (plain, shim):
        assert run["results"]["session_end"]["status"] == 200, run["results"]["session_end"]
    assert plain["results"]["after_session"]["cached"] >= STALE, plain["results"]["after_session"]
    after = shim["results"]["after_session"]
    assert after["cached"] <= 1, after  # the first token: the flush cases' running requests' own, under the new version
    assert after["tokens"] == references()["B"]["tokens"] and logprob_gap(after, references()["B"]) < 1e-3
    assert any("end_weight_update with no tensor or distributed load" in line for line in shim["shim_lines"])


PARALLEL_CASES = ("first", "update_b_no_flush", "after_update", "follower")


@real_sglang
@pytest.mark.full
@pytest.mark.parametrize("kind", PARALLEL)
def test_every_rank_serves_the_new_weights_after_an_update_without_flush(kind):
    """Without the shim a rank that served the prompt before the update serves it again from the old weights' KV (DP:
    which rank gets which request is SGLang's round-robin, so one of the two requests after the update meets it); with
    the shim every rank's scheduler counts the update (one line each) and both requests match transformers with the
    new weights."""
    args, env = PARALLEL[kind], parallel_env(kind)
    plain = server_run(False, args, PARALLEL_CASES, env=env)["results"]
    assert any(_stale(plain[name], references()["B"]) for name in ("after_update", "follower")), plain
    shim = server_run(True, args, PARALLEL_CASES, env=env)
    for name in ("after_update", "follower"):
        result = shim["results"][name]
        assert result["tokens"] == references()["B"]["tokens"], (name, result)
        assert logprob_gap(result, references()["B"]) < 1e-3, (name, result)  # cached or not: the new weights' KV
    if kind == "tp":  # one group, one prefix: the follower shares what the first request after the update computed
        assert shim["results"]["after_update"]["cached"] == 0 and shim["results"]["follower"]["cached"] >= STALE
    ranks = [line for line in shim["shim_lines"] if f"[{ID}]" in line and "weight version 1" in line]
    assert len(ranks) == 2, shim["shim_lines"]  # one per rank's scheduler


TAIL = 100  # the last tokens of each retracted request: decoded well after the update (it comes ~1 s into ~1000)


def _tail_misses(update, checkpoint):
    """Per retracted request, how many of its last TAIL tokens are not transformers' greedy choice with `checkpoint`'s
    weights after the request's prompt and all its tokens before them."""
    misses = []
    for prompt, tokens in zip(RETRACTED_PROMPTS, update["outputs"]):
        expected = greedy_choices(checkpoint, prompt, tokens)
        misses.append(sum(a != b for a, b in zip(tokens[-TAIL:], expected[-TAIL:])))
    return misses


@real_sglang
def test_requests_queued_across_an_update_are_served_the_new_weights(plain, shim):
    """Requests waiting at an update, holding no KV slot (retracted by a `retract` pause: SGLang's documented pause for
    updates; or not yet admitted), take the new weight version: their prefill after the update recomputes prompt and
    tokens so far with the new weights, and the tokens after it are C's greedy choices. Without the shim the prompt's
    KV of the weights before is served again (the radix cache kept it), and the later tokens are not C's. (The branch
    a mutation showed no other test needs: such requests left on the old key.)"""
    update = shim["results"]["update_retracted"]
    assert update["pause"][0] == 200 and update["update"]["status"] == 200, update
    assert all(update["finished"]), update
    misses = _tail_misses(update, checkpoints()["C"])
    assert max(misses) <= 2, misses  # float noise may flip a near-tie
    if down_at(plain, "update_retracted"):  # up to 0.5.21 the server without the shim died at the refused flush before
        pytest.skip(f"the server without the shim died before (SGLang {plain['sglang']}): {plain['died']}")
    update = plain["results"]["update_retracted"]
    assert update["update"]["status"] == 200 and all(update["finished"]), update
    misses = _tail_misses(update, checkpoints()["C"])
    assert min(misses) >= TAIL // 2, misses


@real_sglang
def test_an_update_from_distributed_is_counted(plain, shim):
    """update_weights_from_distributed (a trainer's broadcast, gloo here; in a weight-update session on 0.5.21+), to A
    without flush: without the shim the prompt comes from the cache's KV of B; with it, recomputed with A."""
    update = shim["results"]["update_a_distributed"]
    assert update["init"][0] == 200 and update["update"][0] == 200 and update["update"][1]["success"], update
    after = shim["results"]["after_distributed"]
    assert after["cached"] == 0, after
    assert after["tokens"] == references()["A"]["tokens"] and logprob_gap(after, references()["A"]) < 1e-3
    assert any("weights changed (update_weights_from_distributed)" in line for line in shim["shim_lines"])
    if down_at(plain, "after_distributed"):  # up to 0.5.21 the server without the shim died at the refused flush before
        pytest.skip(f"the server without the shim died before (SGLang {plain['sglang']}): {plain['died']}")
    assert plain["results"]["update_a_distributed"]["update"][0] == 200, plain["results"]["update_a_distributed"]
    assert _stale(plain["results"]["after_distributed"], references()["A"]), plain["results"]["after_distributed"]
