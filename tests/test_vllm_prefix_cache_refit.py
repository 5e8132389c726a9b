"""vllm-prefix-cache-refit on real engines (vLLM's CPU build): a prompt generated, the engine refit in place to other
weights, the same prompt again (tests/children/prefix_cache_engine.py). The second rollout must be transformers'
greedy continuation of the new weights.

"Without the fix" is the shim with this one fix disabled: on the CPU build a refit through the model's load_weights
needs the shim's vllm-cpu-refit to work at all, so that is the closest to what a GPU user runs today. There the second
rollout reads the old weights' KV for its cached prefix (its cached-token count says so) and its tokens differ: the
tests assert that the bug reproduces before they credit the fix.
"""

import pytest

from conftest import child_path, run_case
from vllm_helpers import REAL_ENGINE

ID = "vllm-prefix-cache-refit"
PROMPT = [(i * 37) % 500 + 3 for i in range(300)]  # 18 full KV blocks of 16: a long shared prefix
MAX_TOKENS = 8
WITHOUT_FIX = {"NRL_SHIM": "1", "NRL_SHIM_DISABLE": ID}
WITH_FIX = {"NRL_SHIM": "1"}
pytestmark = REAL_ENGINE


def reference(directory):
    """transformers' greedy continuation of PROMPT and each chosen token's logprob (float32, full forwards)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids, logprobs = list(PROMPT), []
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            scores = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], dim=-1)
            token = int(scores.argmax())
            ids.append(token)
            logprobs.append(float(scores[token]))
    return {"tokens": ids[len(PROMPT) :], "logprobs": logprobs}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tiny_models import write_model

    root = tmp_path_factory.mktemp("prefix-cache-models")
    long_context = {"max_position_embeddings": 1024}
    a = write_model(root / "a", "llama", seed=0, overrides=long_context)
    b = write_model(root / "b", "llama", seed=1, overrides=long_context)
    return {"a": a, "b": b, "reference_a": reference(a), "reference_b": reference(b)}


def case(models, mode, **extra):
    return {
        "mode": mode,
        "model_a": models["a"],
        "model_b": models["b"],
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "prefix_caching": True,
        **extra,
    }


def run(tmp_path, cases, env, name):
    out, proc = run_case(child_path("prefix_cache_engine"), cases, tmp_path, env=env, timeout=900, name=name)
    return out["cases"], proc.stderr


def gap(rollout, expected):
    return max(abs(a - b) for a, b in zip(rollout["logprobs"], expected["logprobs"]))


def ours(log):
    return [message for _level, message in log if f"[{ID}]" in message]


def assert_stale(rollout, models):
    """The bug: the prefix came from the cache of the old weights, and the tokens are not the new weights'."""
    assert rollout["cached"] >= 256, rollout
    assert rollout["tokens"] != models["reference_b"]["tokens"], "the stale prefix cache did not reproduce"


def assert_fresh(rollout, models):
    assert rollout["tokens"] == models["reference_b"]["tokens"], (rollout, models["reference_b"])
    assert gap(rollout, models["reference_b"]) < 1e-3, (rollout, models["reference_b"])


@pytest.fixture(scope="module")
def in_process(models, tmp_path_factory):
    """Engine core in this process, the model refit directly (TRL's colocate way), with and without the fix."""
    tmp = tmp_path_factory.mktemp("in-process")
    without, _ = run(tmp, [case(models, "inproc")], WITHOUT_FIX, "without")
    cases = [
        case(models, "inproc"),
        case(models, "inproc", caller_resets=True),
        case(models, "inproc", prefix_caching=False),
    ]
    with_fix, _ = run(tmp, cases, WITH_FIX, "with")
    return {"without": without[0], "with": with_fix[0], "caller_resets": with_fix[1], "caching_off": with_fix[2]}


def test_in_process_refit_without_the_fix_serves_the_old_weights_kv(in_process, models):
    first = in_process["without"]["result"]["first"]
    assert first["tokens"] == models["reference_a"]["tokens"]  # the refit to A worked: the engine is sound
    assert_stale(in_process["without"]["result"]["second"], models)


def test_in_process_refit_with_the_fix_generates_from_the_new_weights(in_process, models):
    result = in_process["with"]["result"]
    assert result["first"]["tokens"] == models["reference_a"]["tokens"]
    assert result["second"]["cached"] == 0
    assert_fresh(result["second"], models)
    lines = ours(in_process["with"]["log"])
    assert len(lines) == 1 and "stale blocks -> reset before the next step" in lines[0], lines
    assert "vllm/pull/46125" in lines[0]


def test_idle_when_the_caller_resets_after_its_refit(in_process, models):
    result = in_process["caller_resets"]["result"]
    assert_fresh(result["second"], models)
    lines = ours(in_process["caller_resets"]["log"])
    # One INFO saying there was nothing to change; no reset of ours (no "stale blocks" line).
    assert len(lines) == 1 and "nothing to change" in lines[0], lines


def test_prefix_caching_off_nothing_to_do_nothing_logged(in_process, models):
    result = in_process["caching_off"]["result"]
    assert result["second"]["cached"] == 0
    assert_fresh(result["second"], models)
    assert ours(in_process["caching_off"]["log"]) == []


@pytest.fixture(scope="module")
def multiprocess(models, tmp_path_factory):
    """Engine core in its own process; refits through LLM.apply_model (the frameworks' RPC route)."""
    tmp = tmp_path_factory.mktemp("multiprocess")
    without, _ = run(tmp, [case(models, "mp")], WITHOUT_FIX, "without")
    with_fix, stderr = run(tmp, [case(models, "mp")], WITH_FIX, "with")
    return {"without": without[0]["result"], "with": with_fix[0]["result"], "stderr": stderr}


def test_engine_core_process_without_the_fix_serves_the_old_weights_kv(multiprocess, models):
    assert multiprocess["without"]["first"]["tokens"] == models["reference_a"]["tokens"]
    assert_stale(multiprocess["without"]["second"], models)


def test_engine_core_process_with_the_fix(multiprocess, models):
    assert multiprocess["with"]["second"]["cached"] == 0
    assert_fresh(multiprocess["with"]["second"], models)
    # Said in the engine core's process, whose stderr is the job's.
    assert multiprocess["stderr"].count(f"[{ID}] vLLM prefix cache after a refit: stale blocks -> reset") == 1


@pytest.fixture(scope="module")
def async_streams(models, tmp_path_factory):
    """AsyncLLM, refits through collective_rpc, streams running across the second refit."""
    tmp = tmp_path_factory.mktemp("async")
    streams = case(models, "async", streams=3)
    without, _ = run(tmp, [streams], WITHOUT_FIX, "without")
    with_fix, stderr = run(tmp, [streams], WITH_FIX, "with")
    return {"without": without[0]["result"], "with": with_fix[0]["result"], "stderr": stderr}


def test_async_refit_mid_stream_without_the_fix_serves_the_old_weights_kv(async_streams, models):
    result = async_streams["without"]
    assert result["first"]["tokens"] == models["reference_a"]["tokens"]
    assert result["streams_running_at_second"] > 0, "no stream ran across the refit: the scenario did not happen"
    assert_stale(result["second"], models)


def test_async_refit_mid_stream_with_the_fix(async_streams, models):
    result = async_streams["with"]
    assert result["streams_running_at_second"] > 0, "no stream ran across the refit: the scenario did not happen"
    # Requests running at the refit keep their KV and finish; the new request gets no stale hit, and after the streams
    # the held reset has happened.
    assert result["streams"] == [96, 96, 96], result["streams"]
    assert result["second"]["cached"] == 0
    assert_fresh(result["second"], models)
    assert_fresh(result["third"], models)
    assert f"[{ID}] vLLM prefix cache after a refit:" in async_streams["stderr"]
    assert "keep their KV; new requests get no prefix-cache hit" in async_streams["stderr"]
