"""vllm-layerwise-refit on real engines (vLLM's CPU build): refits through the model's own `load_weights` into layers
vLLM re-lays out after loading (tests/children/layerwise_refit_engine.py).

The CPU build prepacks the fused-MoE experts after loading; a refit through `load_weights` writes the checkpoint's
layout into that storage: no error, scrambled rollouts, even under the shim's vllm-cpu-refit (which keeps only linear
layers live). vLLM's own reload_weights is no better there: on a weight update vLLM skips the CPU prepack. An engine
loaded with real weights keeps its linear layers packed (parameters dropped): a refit fails loudly. Under the shim each
refit goes through vLLM's layerwise reload, the experts are prepacked again, and the engine's greedy tokens and
logprobs are transformers' forward of the refit weights: Qwen3-MoE and Qwen2-MoE (shared expert), a dense Llama,
float32 and bfloat16, dummy and real loads, whole state dicts and one tensor per call, several refits with rollouts
between them, and refits in a row with none between (ROWS: whole twice, one tensor per call three times, a tensor sent
twice within one refit, vLLM's reload_weights before and after ours) — scrambled without the fix, and with the fix as
it was before it covered rows.
"""

import statistics

import pytest

from conftest import run_child_cases
from vllm_helpers import real_engine

PROMPTS = [[5, 17, 42], [100, 3, 9, 11], [250, 251]]
MAX_TOKENS = 8
ID = "vllm-layerwise-refit"
# Largest gap (tiny_models.teacher_forced_gaps) allowed for an engine that computes what transformers does: float32
# engines measure ~1e-5; bfloat16 ones (their weights rounded) up to ~0.1. A scrambled layer measures 2-10.
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.3}
SCRAMBLED = 1.0


def right(found, dtype):
    """float32: every prompt within the tolerance. bfloat16: the median prompt (on this AMX CPU a right bf16 engine
    flips a near-tie now and then: checkpoint b of Qwen2-MoE measures 0.12, 0.87, 0.14 after any right refit; a
    scrambled one measures > 5 on most prompts)."""
    return (max(found) if dtype == "float32" else statistics.median(found)) < TOLERANCE[dtype]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Checkpoints A and B (different random weights) of each kind."""
    from tiny_models import write_model

    root = tmp_path_factory.mktemp("models")
    return {
        kind: {label: write_model(root / f"{kind}_{label}", kind, seed=seed) for label, seed in (("a", 0), ("b", 1))}
        for kind in ("qwen3_moe", "qwen2_moe", "llama")
    }


def case(name, models, kind, load_format="dummy", dtype="float32", refits=(), **extra):
    """refits: (route, checkpoint) pairs, each followed by a rollout, and ROWS entries (label, route, checkpoint,
    rollout after it, checkpoint resent in part)."""

    def refit(entry):
        label, via, checkpoint, generate, resend = entry if len(entry) == 5 else ("single", *entry, True, None)
        out = {"label": label, "via": via, "model": models[kind][checkpoint], "generate": generate}
        if resend is not None:
            out["resend"] = models[kind][resend]
        return out

    return {
        "name": name,
        "model": models[kind]["a"],
        "load_format": load_format,
        "dtype": dtype,
        "prompts": PROMPTS,
        "max_tokens": MAX_TOKENS,
        "refits": [refit(entry) for entry in refits],
        **extra,
    }


def row(label, via, checkpoints):
    """Refits in a row, no rollout until after the last one: one per checkpoint letter."""
    return [(label, via, letter, index == len(checkpoints) - 1, None) for index, letter in enumerate(checkpoints)]


# Refits in a row with no rollout between them, each row checked by the rollout after its last refit.
ROWS = {
    "whole twice": row("whole twice", "load_weights", "ba"),
    "per tensor three times": row("per tensor three times", "per_tensor", "bab"),
    # one expert tensor sent before the rest of its layer and another after it (same values: a repeat)
    "a tensor twice": row("a tensor twice", "twice", "a"),
    "reload_weights around ours": [
        ("reload_weights around ours", "reload_weights", "b", False, None),
        ("reload_weights around ours", "load_weights", "a", False, None),
        ("reload_weights around ours", "reload_weights", "b", True, None),
    ],
    # checkpoint b whole, then one expert tensor of a: can't be combined (the warning names it), b stays
    "a tensor resent with other values": [("a tensor resent with other values", "resend", "b", True, "a")],
}


def rows(*names):
    return [entry for name in names for entry in ROWS[name]]


def checked(sent, out):
    """{label: [refits followed by a rollout]} of a case: `sent` its input, `out` the child's output."""
    result = {}
    for refit_in, refit_out in zip(sent["refits"], out["refits"]):
        if refit_in["generate"]:
            result.setdefault(refit_in["label"], []).append(refit_out)
    return result


def run_cases(tmp_path, cases, env):
    out = run_child_cases("layerwise_refit_engine", cases, tmp_path, env)
    out["sent"] = {sent["name"]: sent for sent in cases}
    return out


def rollouts(out, name):
    return checked(out["sent"][name], out["cases"][name])


def gaps(refit):
    from tiny_models import teacher_forced_gaps

    assert refit["error"] is None and refit["tokens"] is not None, refit
    return teacher_forced_gaps(refit["model"], PROMPTS, refit["tokens"], refit["logprobs"])


def ours(log, level=None):
    return [message for lvl, message in log if f"[{ID}]" in message and level in (None, lvl)]


@pytest.fixture(scope="module")
def without_fix(models, tmp_path_factory):
    # Today's shim without this fix (vllm-cpu-refit keeps linear layers live): the MoE corruption itself.
    in_a_row = rows("whole twice", "per tensor three times", "a tensor twice")
    cases = [
        case("qwen3_moe", models, "qwen3_moe", refits=[("load_weights", "a"), ("reload_weights", "a"), *in_a_row]),
        case("llama_auto", models, "llama", load_format="auto", refits=[("per_tensor", "b")]),
        case("qwen2_moe_bf16", models, "qwen2_moe", dtype="bfloat16", refits=in_a_row),
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
        # Whole state dict, then one tensor per call (TRL's way), then vLLM's own reload_weights, a rollout after each;
        # then every row (no rollout within one).
        case(
            "qwen3_moe",
            models,
            "qwen3_moe",
            refits=[("load_weights", "a"), ("per_tensor", "b"), ("reload_weights", "a"), *rows(*ROWS)],
        ),
        case(
            "qwen2_moe_bf16",
            models,
            "qwen2_moe",
            dtype="bfloat16",
            refits=[
                ("per_tensor", "a"),
                *rows("whole twice", "per tensor three times", "a tensor twice", "reload_weights around ours"),
            ],
        ),
        case(
            "qwen3_moe_auto_bf16",
            models,
            "qwen3_moe",
            load_format="auto",
            dtype="bfloat16",
            refits=[("load_weights", "b"), *rows("whole twice", "a tensor twice")],
        ),
        # Real weights: vLLM packs the linear layers (parameters dropped), so they too are re-laid out.
        case(
            "llama_auto",
            models,
            "llama",
            load_format="auto",
            refits=[("per_tensor", "b"), ("load_weights", "a"), *rows("whole twice", "per tensor three times")],
        ),
        # Last (it takes the fix's hooks into vLLM's reload module off, for the rest of the process): the fix as it
        # was before it covered refits in a row. A refit alone is right; rows are scrambled.
        case(
            "qwen3_moe_rows_off",
            models,
            "qwen3_moe",
            refits=[("load_weights", "b"), *rows("whole twice", "per tensor three times", "a tensor twice")],
            rows_off=True,
        ),
    ]
    return run_cases(tmp_path_factory.mktemp("shim"), cases, {"NRL_SHIM": "1"})


@real_engine
def test_without_the_fix_a_moe_refit_is_silently_scrambled(without_fix):
    raw, reload = without_fix["cases"]["qwen3_moe"]["refits"][:2]
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
def test_without_the_fix_refits_in_a_row_are_scrambled(without_fix):
    for name in ("qwen3_moe", "qwen2_moe_bf16"):
        found = rollouts(without_fix, name)
        for label in ("whole twice", "per tensor three times", "a tensor twice"):
            (refit,) = found[label]
            assert statistics.median(gaps(refit)) > SCRAMBLED, (name, label, gaps(refit))


@real_engine
def test_under_the_shim_moe_refits_equal_transformers(under_shim):
    for name in ("qwen3_moe", "qwen2_moe_bf16", "qwen3_moe_auto_bf16", "llama_auto"):
        dtype = "bfloat16" if "bf16" in name else "float32"
        found = rollouts(under_shim, name)
        assert set(found) == {refit["label"] for refit in under_shim["sent"][name]["refits"]}, found.keys()
        for label, refits in found.items():
            for refit in refits:
                assert right(gaps(refit), dtype), (name, label, gaps(refit))
    assert set(rollouts(under_shim, "qwen3_moe")) == {"single", *ROWS}


@real_engine
def test_without_covering_refits_in_a_row_they_are_scrambled(under_shim):
    # The fix before it covered rows (its hooks into vLLM's reload module off): a refit alone right, every row not.
    found = rollouts(under_shim, "qwen3_moe_rows_off")
    ((single,),) = [found.pop("single")]
    assert max(gaps(single)) < TOLERANCE["float32"], gaps(single)
    assert set(found) == {"whole twice", "per tensor three times", "a tensor twice"}
    for label, (refit,) in found.items():
        assert statistics.median(gaps(refit)) > SCRAMBLED, (label, gaps(refit))


@real_engine
def test_under_the_shim_the_changes_are_logged_once_each(under_shim):
    changed = ours(under_shim["log"], "INFO")
    assert len(changed) == len(set(changed)), changed  # each line once
    bracket = [m for m in changed if m.startswith(f"[{ID}] refit of") and "through load_weights" in m]
    # A line per model and setting (the engine whose rows aren't covered, its hooks taken off, says so).
    assert {m.split()[3] for m in bracket} == {"LlamaForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"}
    assert all("vLLM's layerwise reload" in m and "re-laid out after loading" in m for m in bracket), bracket
    assert any("model.layers.0.mlp.experts" in m for m in bracket), bracket
    rows_covered = [m for m in bracket if "any number of refits until then, a layer written again reloaded again" in m]
    (uncovered,) = set(bracket) - set(rows_covered)
    # Where rows aren't covered the INFO line claims nothing for them: the row itself is named, at WARNING.
    assert "Qwen3MoeForCausalLM" in uncovered and "refits until then" not in uncovered, uncovered
    (row,) = [m for m in ours(under_shim["log"], "WARNING") if "two refits in a row with no forward between" in m]
    assert "Qwen3MoeForCausalLM" in row and "refits in a row is not covered on this release" in row, row
    assert len([m for m in changed if "prepacked again" in m]) == 1, changed
    idle = [m for m in changed if "nothing to change" in m and "brackets it" in m]
    assert sorted(m.split()[3] for m in idle) == ["Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"], changed  # vLLM's own


@real_engine
def test_under_the_shim_a_part_resent_with_other_values_is_named(under_shim):
    # After a layer was processed, one of its tensors again with other values: the rest of its checkpoint-layout
    # weights are gone, so the layer keeps what was processed (checkpoint b, right) and a warning names it.
    (refit,) = rollouts(under_shim, "qwen3_moe")["a tensor resent with other values"]
    assert refit["model"].endswith("qwen3_moe_b") and max(gaps(refit)) < TOLERANCE["float32"], gaps(refit)
    (warning,) = [m for m in ours(under_shim["log"], "WARNING") if "again in part" in m]
    assert "model.layers.0.mlp.experts" in warning and "again in part, with other values" in warning, warning


@real_engine
def test_where_the_fix_does_not_act_the_guard_names_the_layers(guarded):
    (refit,) = guarded["cases"]["qwen2_moe"]["refits"]
    assert min(gaps(refit)) > SCRAMBLED, gaps(refit)
    (warning,) = ours(guarded["log"], "WARNING")
    assert "NRL_SHIM_LAYERWISE_REFIT=guard" in warning
    for layer in ("model.layers.0.mlp.experts", "model.layers.1.mlp.experts"):
        assert layer in warning, warning
