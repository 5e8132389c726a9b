"""sglang-dp-seed on a real SGLang HTTP server with two data-parallel ranks (`--dp-size 2`, one core each here): a GRPO
group of 8 requests of one prompt at temperature 1.0, one at a time (round-robin: ranks alternate). Without the shim both ranks seed with the server's
one `random_seed` and the requests they share out come back identical in pairs (4 distinct); with it rank 1 seeds with
`random_seed + 1` (one line) and the group is 8 apart, as on a single-rank server (the shared runs' group)."""

from sglang_helpers import REAL_SGLANG
from sglang_runs import GROUP, PARALLEL, parallel_env, server_run

pytestmark = REAL_SGLANG
ID = "sglang-dp-seed"


def _dp_group(shim):
    return server_run(shim, PARALLEL["dp"], ("group_of_8",), env=parallel_env("dp"))


def test_single_rank_server_samples_a_group_apart():
    """The control, on the shared run with the shim (the plain one of 0.5.12.post1 dies before this case): one rank,
    nothing for the fix to do, 8 apart."""
    run = server_run(True)
    assert run["results"]["group_of_8"]["distinct"] == GROUP, run["results"]["group_of_8"]
    assert not [line for line in run["shim_lines"] if f"[{ID}]" in line], run["shim_lines"]


def test_dp_ranks_sample_alike_without_the_shim():
    assert _dp_group(False)["results"]["group_of_8"]["distinct"] <= GROUP // 2  # pairs: one per rank


def test_dp_ranks_sample_apart_with_the_shim():
    run = _dp_group(True)
    assert run["results"]["group_of_8"]["distinct"] > GROUP // 2, run["results"]
    changed = [line for line in run["shim_lines"] if f"[{ID}]" in line]
    assert len(changed) == 1 and "(DP rank 1): 0 -> 1" in changed[0], run["shim_lines"]  # --random-seed 0 here
