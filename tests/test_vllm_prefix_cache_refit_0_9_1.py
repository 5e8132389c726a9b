"""vllm-prefix-cache-refit on the oldest release in its range: vLLM 0.9.1's V1 engine (CPU build, `nox -s affected`),
through the child of test_vllm_prefix_cache_refit.py: in-process (the model refit directly) and AsyncLLM under load
(a request streaming through two refits made with collective_rpc, a group of 8 sharing a prompt after each).

0.9.1's V1 on a CPU runs bfloat16 only, so transformers' float32 continuation is no reference here: vLLM itself is,
the same engine with the caller's own `reset_prefix_cache()` after its refit (what the frameworks do by hand), run
without the fix. Without the fix the rollout after the refit must read the old weights' cached blocks and differ, or
the tests prove nothing.
"""

import pytest

from conftest import child_path, run_case
from vllm_helpers import AFFECTED_RELEASE

ID = "vllm-prefix-cache-refit"
PROMPT = [(i * 37) % 500 + 3 for i in range(300)]  # 2 full blocks of the CPU build's 128 (+44)
LONG_PROMPT = [(i * 53) % 500 + 3 for i in range(300)]  # the request that runs through both refits
pytestmark = AFFECTED_RELEASE


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from tiny_models import write_model

    root = tmp_path_factory.mktemp("prefix-cache-0.9.1")
    # 0.9.1's V1 LLMEngine loads a tokenizer even with skip_tokenizer_init: a word-level one.
    a, b = (
        write_model(root / n, "llama", seed=s, overrides={"max_position_embeddings": 1024}, tokenizer=True)
        for n, s in (("a", 0), ("b", 1))
    )
    base = {
        "model_a": a,
        "model_b": b,
        "prompt": PROMPT,
        "max_tokens": 8,
        "prefix_caching": True,
        "engine": {"dtype": "bfloat16"},
    }
    load = {
        **base,
        "mode": "load",
        "long_prompt": LONG_PROMPT,
        "long_tokens": 600,
        "policies": ["b", "a"],
        "group": 8,
        "echo_tokens": 100,
    }
    inproc = {**base, "mode": "inproc"}
    # AsyncLLM first: the in-process cases turn vLLM's engine-core process off for the rest of the child.
    cases = {"without": [load, inproc, {**inproc, "caller_resets": True}], "with": [load, inproc]}
    env = {"without": {"NRL_SHIM": "1", "NRL_SHIM_DISABLE": ID}, "with": {"NRL_SHIM": "1"}}
    out = {}
    for name in ("without", "with"):
        result, proc = run_case(
            child_path("prefix_cache_engine"), cases[name], root, env=env[name], timeout=900, name=name
        )
        out[name] = [c["result"] for c in result["cases"]] + [proc.stderr]
    without_load, without, caller_reset, _ = out["without"]
    with_load, with_fix, stderr = out["with"]
    # The references: policy A's rollout of a fresh engine (nothing cached) and B's after the caller's own reset.
    assert caller_reset["second"]["cached"] == 0
    reference = {"a": without["first"]["tokens"], "b": caller_reset["second"]["tokens"]}
    return {
        "without_load": without_load,
        "without": without,
        "with_load": with_load,
        "with": with_fix,
        "reference": reference,
        "stderr": stderr,
    }


def test_in_process_refit_on_0_9_1(runs):
    stale, fresh = runs["without"]["second"], runs["with"]["second"]
    assert stale["cached"] >= 256 and stale["tokens"] != runs["reference"]["b"], "the stale cache did not reproduce"
    assert fresh["cached"] == 0 and fresh["tokens"] == runs["reference"]["b"], fresh
    assert f"[{ID}] vLLM prefix cache after a refit: stale blocks -> reset before the next step" in runs["stderr"]


def test_under_load_on_0_9_1(runs):
    leader = runs["without_load"]["groups"][0]["members"][0]
    assert leader["cached"] >= 256 and leader["tokens"] != runs["reference"]["b"], "the stale cache did not reproduce"
    result = runs["with_load"]
    for group in result["groups"]:
        assert group["long_running"], "the long request had finished before a refit: the load did not happen"
        assert all(m["tokens"] == runs["reference"][group["policy"]] for m in group["members"]), group
        cached = [m["cached"] for m in group["members"]]
        assert cached[0] == 0 and all(c >= 256 for c in cached[1:]), cached  # the followers share the new blocks
    assert result["long"] == 600
    # The running request's prompt blocks left the cache; the block it filled after the refit never entered it.
    assert result["echoes"]["prompt"]["cached"] == 0 and result["echoes"]["extended"]["cached"] == 256
    assert "cached block(s) dropped from the prefix cache before the next step" in runs["stderr"]
