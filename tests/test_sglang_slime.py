"""slime's own SGLang engine code, unmodified (slime 624b824a8: slime/backends/sglang_utils/sglang_engine.py, its source
beside this checkout or at NRL_SHIM_SLIME_624B824A8), on a real SGLang server on the CPU, with and without the shim:
slime's SGLangEngine builds the ServerArgs from slime's arguments and starts `launch_server` in a spawn child, as its
Ray actor does (tests/children/sglang_server.py, launch route `slime`); its refits go through its engine methods while
rollouts run (`slime_update`):
- the disk route (slime/ray/actor_group.py `_reload_rollout_weights_from_disk`): pause_generation, flush_cache
  (retried until a 200), update_weights_from_disk with the next weight version, continue_generation;
- the distributed route (UpdateWeightFromDistributed.update_weights): pause, flush, init_weights_update_group,
  update_weights_from_distributed while the trainer broadcasts (this process, gloo), continue.

What it showed on 0.5.15.post1 (slime's pin; `nox -s sglang_slime`): slime's pause aborts the running rollouts and
its flush then empties the radix cache, so neither route serves KV of older weights without the shim; under it the
same tokens, each refit counted by sglang-radix-cache-refit, nothing written under site-packages. On 0.5.23 slime
624b824a8 starts no engine (its `dataclasses.fields(ServerArgs)`: 0.5.23's ServerArgs is no dataclass), with or
without the shim; the test skips there.
"""

import dataclasses
import json
import os
import sys

import pytest
from nemo_rl_helpers import SHARED

from sglang_helpers import REAL_SGLANG, SGLANG_VERSION, logprob_gap
from sglang_runs import MAX_TOKENS, PROMPT, RUNNING_PROMPT, references, server_run
from site_packages_hash import differences, site_packages, snapshot

pytestmark = [*REAL_SGLANG, pytest.mark.full]

SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
SLIME_VARIABLE = "NRL_SHIM_SLIME_624B824A8"
SLIME_SGLANG = "0.5.15.post1"  # its image's pin (docker/patch/v0.5.15.post1)
SLIME_ENGINE = os.path.join("slime", "backends", "sglang_utils", "sglang_engine.py")

# Two rollouts decoding when each refit comes (slime's rollout in flight), then the prompt served before: B after the
# disk refit, A after the broadcast.
ROLLOUTS = {"requests": 2, "prompt": RUNNING_PROMPT, "max_tokens": 1000}
SLIME_ORDER = [
    ("first", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    ("refit_disk", {"kind": "slime_update", "route": "disk", "model_path": "B", "weight_version": 1, **ROLLOUTS}),
    ("after_disk", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
    (
        "refit_distributed",
        {"kind": "slime_update", "route": "distributed", "model_path": "A", "weight_version": 2, **ROLLOUTS},
    ),
    ("after_distributed", {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS}),
]


def slime_source():
    """(directory, None) where slime's source at SLIME_COMMIT is, else (None, why not and how to get it)."""
    given = os.environ.get(SLIME_VARIABLE)
    directory = given or os.path.join(SHARED, "slime", SLIME_COMMIT[:9])
    if not os.path.isfile(os.path.join(directory, SLIME_ENGINE)):
        how = f"{SLIME_VARIABLE}={given}" if given else f"{SLIME_VARIABLE} is not set and {directory}"
        return None, (
            f"needs slime's source at commit {SLIME_COMMIT[:9]} ({how} holds no {SLIME_ENGINE}): `git clone "
            f"https://github.com/THUDM/slime && git -C slime checkout {SLIME_COMMIT}`, then set {SLIME_VARIABLE}"
        )
    return directory, None


def _server_args_is_a_dataclass():
    from sglang.srt.server_args import ServerArgs

    return dataclasses.is_dataclass(ServerArgs)


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "shim"])
def run(request):
    source, why = slime_source()
    if source is None:
        pytest.skip(why)
    if SGLANG_VERSION != SLIME_SGLANG:
        pytest.skip(
            f"slime {SLIME_COMMIT[:9]} pins SGLang {SLIME_SGLANG} (`nox -s sglang_slime`); this is {SGLANG_VERSION}"
        )
    if not _server_args_is_a_dataclass():
        pytest.skip(
            f"SGLang {SGLANG_VERSION}: ServerArgs is no dataclass, and slime {SLIME_COMMIT[:9]}'s SGLangEngine reads it "
            "with dataclasses.fields (TypeError at its start, shim or not): slime pins 0.5.15.post1 (`nox -s sglang_slime`)"
        )
    installed = site_packages(sys.executable)
    before = snapshot(roots=installed)
    out = server_run(request.param, launch="slime", order=json.dumps(SLIME_ORDER), slime=source)
    return {**out, "shim": request.param, "changed": differences(before, snapshot(roots=installed))}


def _refit_went_through(refit):
    for step in ("pause", "flush", "update", "continue"):
        assert refit[step]["ok"], (step, refit)
    # slime's pause is SGLang's default, abort: the running rollouts come back aborted (slime's partial rollouts
    # send them again after continue)
    assert all(r.get("status") == 200 and r["finish"]["type"] == "abort" for r in refit["rollouts"]), refit


def test_slimes_first_request_matches_transformers(run):
    first = run["results"]["first"]
    assert first["tokens"] == references()["A"]["tokens"] and logprob_gap(first, references()["A"]) < 1e-3, first


def test_slimes_disk_refit_serves_the_new_weights(run):
    """With and without the shim: slime's flush after its pause leaves no KV of A, so the prompt is recomputed with B."""
    refit = run["results"]["refit_disk"]
    _refit_went_through(refit)
    assert refit["update"]["answer"]["success"], refit
    after = run["results"]["after_disk"]
    assert after["cached"] == 0 and after["tokens"] == references()["B"]["tokens"], after
    assert logprob_gap(after, references()["B"]) < 1e-3, after


def test_slimes_distributed_refit_serves_the_new_weights(run):
    refit = run["results"]["refit_distributed"]
    _refit_went_through(refit)
    calls = refit["update"]["answer"]
    assert calls["init"]["success"] and calls["update"]["success"], calls
    after = run["results"]["after_distributed"]
    assert after["cached"] == 0 and after["tokens"] == references()["A"]["tokens"], after
    assert logprob_gap(after, references()["A"]) < 1e-3, after


def test_each_slime_refit_is_counted_under_the_shim(run):
    changed = [line for line in run["shim_lines"] if "[sglang-radix-cache-refit]" in line and "weights changed" in line]
    if not run["shim"]:
        assert run["shim_lines"] == [], run["shim_lines"]
        return
    assert [("update_weights_from_disk" in line, "update_weights_from_distributed" in line) for line in changed] == [
        (True, False),
        (False, True),
    ], changed


def test_nothing_is_written_under_site_packages(run):
    assert run["changed"] == [], run["changed"]
