"""Real engines (vLLM's CPU build): the fixes act on engines that really run, not only on engine configs.

Tiny Gemma-3 and Llama checkpoints are written by transformers with random weights; transformers' greedy tokens are
the reference. Each scenario runs in a fresh interpreter whose activation comes from its environment, as in a job.
"""

import os

import pytest

from conftest import run_case
from vllm_helpers import REAL_ENGINE

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = REAL_ENGINE
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tiny_models import greedy_tokens, write_model
    from vllm_engine_child import PROMPTS

    root = tmp_path_factory.mktemp("models")
    out = {}
    for kind in ("gemma3_text", "llama"):
        directory = write_model(root / kind, kind)
        out[kind] = {"dir": directory, "reference": greedy_tokens(directory, PROMPTS, MAX_TOKENS)}
    return out


def run_engine_case(tmp_path, case, env):
    return run_case(os.path.join(HERE, "vllm_engine_child.py"), case, tmp_path, env)


@pytest.mark.parametrize("kind", ["gemma3_text", "llama"])
def test_dummy_load_under_the_shim_then_refit(kind, models, tmp_path):
    from vllm_engine_child import PROMPTS

    model = models[kind]
    case = {"kind": "llm", "model": model["dir"], "load_format": "dummy", "prompts": PROMPTS, "max_tokens": MAX_TOKENS}
    out, proc = run_engine_case(tmp_path, case, {"NRL_SHIM": "1"})
    if kind == "gemma3_text":
        # The fix: real weights from the start, so generation before any refit is already the model's own.
        assert out["load_format"] == "auto"
        assert out["before"] == model["reference"]
        assert "[vllm-gemma-load-format] vllm load_format for gemma3_text model" in proc.stderr
    else:
        assert out["load_format"] == "dummy"  # not a Gemma: left alone
        assert out["before"] != model["reference"]
        assert "vllm-gemma-load-format" not in proc.stderr
    assert out["after"] == model["reference"]  # the in-place refit an RL loop does


def test_gemma_dummy_load_without_the_shim_stays_dummy(models, tmp_path):
    model = models["gemma3_text"]
    case = {
        "kind": "llm",
        "model": model["dir"],
        "load_format": "dummy",
        "prompts": [[5, 17, 42, 7]],
        "max_tokens": MAX_TOKENS,
    }
    out, _ = run_engine_case(tmp_path, case, {"NRL_SHIM": "0"})
    assert out["load_format"] == "dummy"
    assert out["before"] != model["reference"][:1]


def test_async_streams_time_out_abort_and_the_engine_recovers(models, tmp_path):
    # A timeout far below the first-token latency: every stream must end in the shim's timeout error.
    case = {"kind": "async", "mode": "timeout", "model": models["llama"]["dir"], "max_tokens": MAX_TOKENS}
    out, _ = run_engine_case(tmp_path, case, {"NRL_SHIM": "1", "NRL_VLLM_ASYNC_TIMEOUT_SECONDS": "0.001"})
    assert out["shim_active"] is True
    assert len(out["streams"]) == 8
    for stream in out["streams"]:
        assert isinstance(stream, str) and stream.startswith("ShimTimeoutError: "), stream
        assert "export NRL_VLLM_ASYNC_TIMEOUT_SECONDS=0.002" in stream
    assert out["unfinished"] == 0
    assert out["next"] == models["llama"]["reference"][0]


def test_async_streams_complete_and_one_cancelled_leaves_the_others(models, tmp_path):
    reference = models["llama"]["reference"]
    case = {"kind": "async", "mode": "default", "model": models["llama"]["dir"], "max_tokens": MAX_TOKENS}
    out, _ = run_engine_case(tmp_path, case, {"NRL_SHIM": "1"})
    assert out["shim_active"] is True
    assert out["with_shim"] == reference
    assert out["without_shim"] == out["with_shim"]
    cancelled = out["cancel_one"]
    assert cancelled[3].startswith("CancelledError")
    assert cancelled[:3] + cancelled[4:] == reference[:3] + reference[4:]
    assert out["unfinished"] == 0
