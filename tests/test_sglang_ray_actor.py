"""The SGLang fixes where NeMo RL HEAD runs its SGLang servers (`nox -t full`, a further route of the fixes CI shows on
`python -m sglang.launch_server`): a Ray actor that builds `ServerArgs(**kwargs)` in Python and runs
`launch_server(server_args)` in a `multiprocessing` spawn child (nemo_rl/models/generation/sglang/sglang_worker.py),
whose scheduler and detokenizer are further processes. Nothing but the environment (NRL_SHIM=1, as `nrl-shim run`
sets it) carries the shim there: the radix fix must act in the scheduler (an update without a flush, then the prompt
served before: the new weights' tokens, exact to transformers; the next request shares the new prefix) and the
sampling-defaults fix in the HTTP server (a chat group of 8 not collapsed by the checkpoint's `top_k: 1`; on SGLang
0.5.20+ a ServerArgs built in Python can't say whether `--sampling-defaults model` was chosen, and the fix says so).
One server start (~1-5 min here)."""

import pytest

from sglang_helpers import REAL_SGLANG, logprob_gap
from sglang_runs import GROUP, PROMPT, references, server_run

pytestmark = [*REAL_SGLANG, pytest.mark.full]
CASES = ("first", "update_b_no_flush", "after_update", "follower", "chat_unset")


@pytest.fixture(scope="module")
def in_actor():
    return server_run(True, (), CASES, launch="ray_actor")


def test_radix_fix_acts_in_the_scheduler_of_a_server_started_in_a_ray_actor(in_actor):
    results = in_actor["results"]
    assert in_actor["died"] is None, in_actor["log_tail"]
    assert results["first"]["tokens"] == references()["A"]["tokens"], results["first"]
    assert results["update_b_no_flush"]["status"] == 200, results["update_b_no_flush"]
    after, follower = results["after_update"], results["follower"]
    assert after["cached"] == 0, after  # without the shim: 299 of the old weights' (test_sglang_radix_cache_refit.py)
    assert after["tokens"] == references()["B"]["tokens"] and logprob_gap(after, references()["B"]) < 1e-3
    assert follower["cached"] >= len(PROMPT) - 1, follower
    lines = [line for line in in_actor["shim_lines"] if "[sglang-radix-cache-refit]" in line]
    assert any("weight version 1" in line for line in lines), in_actor["shim_lines"]


def test_sampling_defaults_fix_acts_in_a_server_started_in_a_ray_actor(in_actor):
    texts = in_actor["results"]["chat_unset"]["texts"]
    assert len(texts) == GROUP and len(set(texts)) > GROUP // 2, texts  # 1 without the shim
    changed = [line for line in in_actor["shim_lines"] if "[sglang-sampling-defaults]" in line]
    assert len(changed) == 1 and "'top_k': 1" in changed[0] and "-> {}" in changed[0], in_actor["shim_lines"]
