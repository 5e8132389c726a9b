"""vllm-layerwise-refit on real engines (vLLM's CPU build): refits through the model's own `load_weights` into layers
vLLM re-lays out after loading (tests/children/layerwise_refit_engine.py).

The CPU build prepacks the fused-MoE experts after loading; a refit through `load_weights` writes the checkpoint's
layout into that storage: no error, scrambled rollouts, even under the shim's vllm-cpu-refit (which keeps only linear
layers live). vLLM's own reload_weights is no better there: on a weight update vLLM skips the CPU prepack. An engine
loaded with real weights keeps its linear layers packed (parameters dropped): a refit fails loudly. Under the shim each
refit goes through vLLM's layerwise reload, the experts are prepacked again, and the engine's greedy tokens and
logprobs are transformers' forward of the refit weights: Qwen3-MoE and Qwen2-MoE (shared expert), a dense Llama,
float32 and bfloat16, dummy and real loads, whole state dicts and one tensor per call, several refits in a row.
"""

import json

import pytest

from conftest import run_child_json
from vllm_helpers import REAL_ENGINE

PROMPTS = [[5, 17, 42], [100, 3, 9, 11], [250, 251]]
MAX_TOKENS = 8
ID = "vllm-layerwise-refit"
# Largest gap (tiny_models.teacher_forced_gaps) allowed for an engine that computes what transformers does: float32
# engines measure ~1e-5; bfloat16 ones (their weights rounded) up to ~0.1. A scrambled layer measures 2-10.
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.3}
SCRAMBLED = 1.0


def real_engine(test):
    for mark in REAL_ENGINE:
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Checkpoints A and B (different random weights) of each kind."""
    from tiny_models import write_model

    root = tmp_path_factory.mktemp("models")
    return {
        kind: {label: write_model(root / f"{kind}_{label}", kind, seed=seed) for label, seed in (("a", 0), ("b", 1))}
        for kind in ("qwen3_moe", "qwen2_moe", "llama")
    }


def case(name, models, kind, load_format="dummy", dtype="float32", refits=()):
    return {
        "name": name,
        "model": models[kind]["a"],
        "load_format": load_format,
        "dtype": dtype,
        "prompts": PROMPTS,
        "max_tokens": MAX_TOKENS,
        "refits": [{"via": via, "model": models[kind][checkpoint]} for via, checkpoint in refits],
    }


def run_cases(tmp_path, cases, env):
    out, _ = run_child_json("layerwise_refit_engine", json.dumps(cases), env=env, timeout=900, cwd=tmp_path)
    return out


def gaps(refit):
    from tiny_models import teacher_forced_gaps

    assert refit["error"] is None and refit["tokens"] is not None, refit
    return teacher_forced_gaps(refit["model"], PROMPTS, refit["tokens"], refit["logprobs"])


def ours(log, level=None):
    return [message for lvl, message in log if f"[{ID}]" in message and level in (None, lvl)]


@pytest.fixture(scope="module")
def without_fix(models, tmp_path_factory):
    # Today's shim without this fix (vllm-cpu-refit keeps linear layers live): the MoE corruption itself.
    cases = [
        case("qwen3_moe", models, "qwen3_moe", refits=[("load_weights", "a"), ("reload_weights", "a")]),
        case("llama_auto", models, "llama", load_format="auto", refits=[("per_tensor", "b")]),
    ]
    env = {"NRL_SHIM": "1", "NRL_SHIM_DISABLE": ID}
    return run_cases(tmp_path_factory.mktemp("without"), cases, env)


@pytest.fixture(scope="module")
def guarded(models, tmp_path_factory):
    cases = [case("qwen2_moe", models, "qwen2_moe", refits=[("load_weights", "a")])]
    env = {"NRL_SHIM": "1", "NRL_SHIM_LAYERWISE_REFIT": "guard"}
    return run_cases(tmp_path_factory.mktemp("guard"), cases, env)


@pytest.fixture(scope="module")
def under_shim(models, tmp_path_factory):
    cases = [
        # Whole state dict, then one tensor per call (TRL's way), then vLLM's own reload_weights: three refits.
        case(
            "qwen3_moe",
            models,
            "qwen3_moe",
            refits=[("load_weights", "a"), ("per_tensor", "b"), ("reload_weights", "a")],
        ),
        case("qwen2_moe_bf16", models, "qwen2_moe", dtype="bfloat16", refits=[("per_tensor", "a")]),
        case(
            "qwen3_moe_auto_bf16",
            models,
            "qwen3_moe",
            load_format="auto",
            dtype="bfloat16",
            refits=[("load_weights", "b")],
        ),
        # Real weights: vLLM packs the linear layers (parameters dropped), so they too are re-laid out.
        case("llama_auto", models, "llama", load_format="auto", refits=[("per_tensor", "b"), ("load_weights", "a")]),
    ]
    return run_cases(tmp_path_factory.mktemp("shim"), cases, {"NRL_SHIM": "1"})


@real_engine
def test_without_the_fix_a_moe_refit_is_silently_scrambled(without_fix):
    raw, reload = without_fix["cases"]["qwen3_moe"]["refits"]
    # No error, and every prompt's continuation is far from the refit weights' (the failure must reproduce).
    assert min(gaps(raw)) > SCRAMBLED, gaps(raw)
    # vLLM's own bracketed reload: the CPU build skips the experts' prepack on a weight update.
    assert min(gaps(reload)) > SCRAMBLED, gaps(reload)
    assert ours(without_fix["log"]) == []


@real_engine
def test_without_the_fix_a_packed_engine_refit_fails(without_fix):
    (refit,) = without_fix["cases"]["llama_auto"]["refits"]
    assert refit["error"] is not None and "weight" in refit["error"], refit


@real_engine
def test_under_the_shim_moe_refits_equal_transformers(under_shim):
    for name in ("qwen3_moe", "qwen2_moe_bf16", "qwen3_moe_auto_bf16", "llama_auto"):
        out = under_shim["cases"][name]
        dtype = "bfloat16" if "bf16" in name else "float32"
        for index, refit in enumerate(out["refits"]):
            assert max(gaps(refit)) < TOLERANCE[dtype], (name, index, gaps(refit))


@real_engine
def test_under_the_shim_the_changes_are_logged_once_each(under_shim):
    changed = ours(under_shim["log"], "INFO")
    assert len(changed) == len(set(changed)), changed  # each line once
    bracket = [m for m in changed if m.startswith(f"[{ID}] refit of") and "through load_weights" in m]
    # A line per model (the real-weights Qwen3-MoE engine has its linear layers packed too: a line of its own).
    assert sorted(m.split()[3] for m in bracket) == [
        "LlamaForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM",
        "Qwen3MoeForCausalLM",
    ], bracket
    assert all("vLLM's layerwise reload" in m and "re-laid out after loading" in m for m in bracket), bracket
    assert any("model.layers.0.mlp.experts" in m for m in bracket), bracket
    assert len([m for m in changed if "prepacked again" in m]) == 1, changed
    idle = [m for m in changed if "nothing to change" in m and "brackets it" in m]
    assert len(idle) == 1, changed  # vLLM's reload_weights brackets itself


@real_engine
def test_where_the_fix_does_not_act_the_guard_names_the_layers(guarded):
    (refit,) = guarded["cases"]["qwen2_moe"]["refits"]
    assert min(gaps(refit)) > SCRAMBLED, gaps(refit)
    (warning,) = ours(guarded["log"], "WARNING")
    assert "NRL_SHIM_LAYERWISE_REFIT=guard" in warning
    for layer in ("model.layers.0.mlp.experts", "model.layers.1.mlp.experts"):
        assert layer in warning, warning
