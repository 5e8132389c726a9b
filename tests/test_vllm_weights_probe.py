"""vllm-weights-probe on real engines (vLLM's CPU build): refits as RL frameworks send them give no finding, and each
shape the probe exists for is named at the refit where it happens, in the engine's worker, before the next step
serves from it. Each shape's failure is shown too: the engine really serves from the wrong weights (the reloaded
checkpoint's tokens; the same tokens after a refit that landed nowhere), with nothing said by vLLM. The mechanism on
torch modules: tests/test_probe_weights.py.
"""

import pytest

from conftest import run_child_json
from vllm_helpers import real_engine


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tiny_models import write_model

    return {"llama": write_model(tmp_path_factory.mktemp("models") / "llama", "llama")}


def run_scenarios(tmp_path, cases, env=None):
    args = (f"{k}={v}" for k, v in cases.items())
    env = {"NRL_SHIM": "1", "NRL_SHIM_LOG_LEVEL": "DEBUG", **(env or {})}
    return run_child_json("weights_probe_engine", *args, env=env, timeout=900, cwd=tmp_path)[0]


@pytest.fixture(scope="module")
def outcomes(models, tmp_path_factory):
    # One interpreter, one fresh engine per scenario.
    llama = models["llama"]
    cases = {"quiet": llama, "reload": llama, "under": llama, "nowhere": llama, "prefix": llama, "head": llama}
    return run_scenarios(tmp_path_factory.mktemp("probe"), cases)


@pytest.fixture(scope="module")
def without_prefix_fix(models, tmp_path_factory):
    # The prefix-cache fix off, the probe on: what a user of a refit route the fix does not see gets.
    env = {"NRL_SHIM_DISABLE": "vllm-prefix-cache-refit"}
    return run_scenarios(tmp_path_factory.mktemp("stale"), {"prefix": models["llama"]}, env)["prefix"]


@pytest.fixture(scope="module")
def without_cpu_refit_fix(models, tmp_path_factory):
    # The CPU build's refit fixes off, the probe on: its packed kernel copies stay as vLLM made them (vllm-layerwise-refit
    # would refit through vLLM's own reload, which packs them again).
    env = {"NRL_SHIM_DISABLE": "vllm-cpu-refit,vllm-layerwise-refit"}
    return run_scenarios(tmp_path_factory.mktemp("packed"), {"head": models["llama"]}, env)["head"]


def probe_warnings(outcome):
    assert outcome["error"] is None, outcome
    return [m for level, m in outcome["probe"] if level == "WARNING"]


@real_engine
def test_refits_of_a_policy_in_training_give_no_finding(outcomes):
    # A first sync over dummy weights, a bucketed refit (three calls), the same tensors again, a further step.
    quiet = outcomes["quiet"]
    assert probe_warnings(quiet) == [], quiet
    assert any("the refit probe follows LlamaForCausalLM" in m for _, m in quiet["probe"]), quiet
    tokens = quiet["tokens"]
    assert tokens[1] != tokens[0] and tokens[2] == tokens[1] and tokens[3] != tokens[2], tokens  # each refit served


@real_engine
def test_checkpoint_reloaded_over_the_synced_weights_is_named(outcomes):
    reload = outcomes["reload"]
    before, synced, after = reload["tokens"]
    # The failure: after vLLM's reload from disk the engine serves the checkpoint again, not the policy it was sent.
    assert synced != before and after == before, reload["tokens"]
    (warning,) = probe_warnings(reload)
    assert "refit 2 left the weights exactly as they were when loaded at start-up" in warning, warning
    assert "TP rank 0" in warning and "TRL#5312" in warning


@real_engine
def test_a_write_under_the_engine_is_named_at_the_next_refit(outcomes):
    under = outcomes["under"]
    (warning,) = probe_warnings(under)
    assert "1 parameter(s) changed after refit 1 with no refit through the engine since (model.norm.weight)" in warning


@real_engine
def test_a_refit_that_landed_nowhere_is_named(outcomes):
    nowhere = outcomes["nowhere"]
    first, second, third = nowhere["tokens"]
    assert first == second == third, nowhere["tokens"]  # the failure: the refits changed nothing the engine serves
    (warning,) = probe_warnings(nowhere)
    assert "refit 3 sent 2 tensor(s) that changed since they were last sent" in warning, warning
    assert "q_proj.bias" in warning and "no weight of the model changed" in warning


@real_engine
def test_stale_prefix_cache_kv_after_a_refit_is_named(without_prefix_fix):
    # The failure: after the refit the shared prompt is served from KV the checkpoint computed; the same request
    # recomputed (a cache salt) gets other logprobs. vLLM says nothing.
    stale = without_prefix_fix
    assert stale["error"] is None, stale
    _, served, recomputed = stale["logprobs"]
    assert max(abs(a - b) for a, b in zip(served, recomputed)) > 1e-3, stale["logprobs"]
    (warning,) = probe_warnings(stale)
    assert "served vs recomputed" in warning and "after refit 2" in warning, warning
    assert "served 128 token(s) of cached KV (1 cache entry) computed before that refit" in warning, warning
    assert "vllm-prefix-cache-refit off" in warning, warning


@real_engine
def test_with_the_prefix_fix_on_the_served_prefix_is_the_recomputed_one(outcomes):
    # The same run with every fix on: the served request equals the recomputed one, and the probe says nothing.
    prefix = outcomes["prefix"]
    assert probe_warnings(prefix) == [], prefix
    _, served, recomputed = prefix["logprobs"]
    assert max(abs(a - b) for a, b in zip(served, recomputed)) < 1e-4, prefix["logprobs"]


@real_engine
def test_a_layer_computing_from_its_packed_copy_after_a_refit_is_named(without_cpu_refit_fix):
    # The failure: the LM head's parameter takes the checkpoint's values, yet the engine keeps generating the dummy
    # weights' tokens from the copy vLLM's CPU build packed at load. Every digest says the refit landed.
    packed = without_cpu_refit_fix
    assert packed["error"] is None, packed
    before, after = packed["tokens"]
    assert after == before, packed["tokens"]
    (warning,) = probe_warnings(packed)
    assert "live layer vs a fresh load" in warning and "after refit 1, 1 layer(s)" in warning, warning
    assert "lm_head (" in warning, warning


@real_engine
def test_with_the_cpu_refit_fix_on_the_live_layers_match_their_weights(outcomes):
    # The same refit with every fix on: the engine serves the new head, and the probe says nothing. Its largest gap
    # here is the kernel noise (float32: the same GEMM).
    head = outcomes["head"]
    assert probe_warnings(head) == [], head
    before, after = head["tokens"]
    assert after != before, head["tokens"]
    (gap,) = [g for g in head["live_gaps"] if g is not None]
    assert gap < 1e-6, head["live_gaps"]


@real_engine
@pytest.mark.full
def test_probe_off_says_nothing_and_strict_stops_the_step(models, tmp_path):
    llama = models["llama"]
    (tmp_path / "off").mkdir()
    (tmp_path / "strict").mkdir()
    off = run_scenarios(tmp_path / "off", {"reload": llama}, {"NRL_SHIM_PROBE": "off"})["reload"]
    assert off["probe"] == [] and off["tokens"][2] == off["tokens"][0], off
    strict = run_scenarios(tmp_path / "strict", {"reload_strict": llama}, {"NRL_SHIM_STRICT": "1"})["reload_strict"]
    assert strict["error"] is not None and "ProbeFindingError" in strict["error"], strict
    assert len(strict["tokens"]) == 2, strict  # the generation after the reload never ran
