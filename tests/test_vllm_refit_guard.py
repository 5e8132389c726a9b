"""vllm-refit-guard on real engines (vLLM's CPU build): refits as RL frameworks send them, reported or not; and on
vLLM 0.8.5's real model objects (no engine can run that release here), where Gemma's `normalizer` is the bug itself.

On the CPU build, vLLM repacks linear weights after loading into a form outside the state_dict (their parameters
become empty); under the shim the vllm-cpu-refit fix keeps a dummy-loaded model's linear weights live, so the guard
compares every weight there, as on a GPU. With that fix disabled it compares norms, embeddings and the head, and says
at DEBUG what it cannot compare. The refit goes through vLLM's in-place `reload_weights` (it calls the model's
`load_weights`, the call the guard watches; a direct `load_weights` fails on the CPU build after the repack).
"""

import pytest
from packaging.version import Version

from conftest import run_child_json
from vllm_helpers import INSTALLED_VLLM, real_engine, reported_names

VLLM = INSTALLED_VLLM


# Layer 1's tensors: the norms, and the linear weights (the guard compares those on the CPU build only while the
# vllm-cpu-refit fix keeps them live, see above).
LAYER_1_NORMS = ["model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight"]
LAYER_1_LINEAR = [
    f"model.layers.1.{name}.weight"
    for name in ("mlp.down_proj", "mlp.gate_up_proj", "self_attn.o_proj", "self_attn.qkv_proj")
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tiny_models import write_model

    root = tmp_path_factory.mktemp("models")
    return {
        "llama": write_model(root / "llama", "llama"),
        "llama_tied": write_model(root / "llama_tied", "llama", tie_word_embeddings=True),
        "gemma": write_model(root / "gemma", "gemma3_text"),
    }


def run_scenarios(tmp_path, cases, env):
    args = (f"{k}={v}" for k, v in cases.items())
    env = {"NRL_SHIM": "1", "NRL_SHIM_LOG_LEVEL": "DEBUG", **env}
    return run_child_json("refit_guard_engine", *args, env=env, timeout=900, cwd=tmp_path)[0]


@pytest.fixture(scope="module")
def outcomes(models, tmp_path_factory):
    # One interpreter, one fresh engine per scenario. Gemma's own fix stays off here so that Gemma keeps dummy
    # weights on this fixed release (normalizer non-persistent): the guard must find nothing to report.
    return run_scenarios(
        tmp_path_factory.mktemp("guard"),
        {
            "full": models["llama"],
            "split": models["llama"],
            "skip_layer": models["llama"],
            "wrong_name": models["llama"],
            "auto": models["llama"],
            "tied": models["llama_tied"],
            "gemma": models["gemma"],
        },
        {"NRL_SHIM_GEMMA_LOAD_FORMAT": "off"},
    )


@real_engine
def test_full_refit_reports_nothing(outcomes):
    # Also generates before the refit: a dummy-weight generation before any refit is not checked.
    assert outcomes["full"]["guarded"] and outcomes["full"]["warnings"] == [], outcomes["full"]


@real_engine
def test_refit_split_over_several_calls_reports_nothing(outcomes):
    # Three reload_weights calls (vLLM's own check warns for each call's missing part); the guard sums them.
    assert outcomes["split"]["guarded"] and outcomes["split"]["warnings"] == [], outcomes["split"]


@real_engine
def test_refit_that_skips_a_layer_reports_exactly_its_tensors_once(outcomes):
    warnings = outcomes["skip_layer"]["warnings"]
    assert len(warnings) == 1, warnings  # generated twice: reported once
    assert reported_names(warnings[0]) == sorted(LAYER_1_NORMS + LAYER_1_LINEAR)
    assert "LlamaForCausalLM" in warnings[0] and "still hold random values" in warnings[0]
    assert "check that the refit sends these names" in warnings[0]


@real_engine
def test_packed_linear_weights_are_said_at_debug_not_guessed(models, tmp_path):
    # Without the CPU refit fix, vLLM's CPU build packs the linear weights out of the state_dict.
    env = {"NRL_SHIM_GEMMA_LOAD_FORMAT": "off", "NRL_SHIM_DISABLE": "vllm-cpu-refit"}
    out = run_scenarios(tmp_path, {"skip_layer": models["llama"]}, env)["skip_layer"]
    (warning,) = out["warnings"]
    assert reported_names(warning) == LAYER_1_NORMS
    assert any("cannot guard" in line and "model.layers.1.mlp.down_proj.weight" in line for line in out["debug"])


@real_engine
def test_one_wrong_name_is_reported(outcomes):
    (warning,) = outcomes["wrong_name"]["warnings"]
    assert reported_names(warning) == ["model.layers.1.post_attention_layernorm.weight"]


@real_engine
def test_engine_loaded_with_real_weights_is_not_guarded(outcomes):
    assert outcomes["auto"] == {"warnings": [], "debug": outcomes["auto"]["debug"], "guarded": False, "error": None}


@real_engine
def test_tied_weights_are_not_false_positives(outcomes):
    # The head shares the embedding's tensor: the checkpoint sends it once, both names are written.
    assert outcomes["tied"]["guarded"] and outcomes["tied"]["warnings"] == [], outcomes["tied"]


@real_engine
def test_gemma_on_a_fixed_release_dummy_then_full_refit_reports_nothing(outcomes):
    assert outcomes["gemma"]["guarded"] and outcomes["gemma"]["warnings"] == [], outcomes["gemma"]


@real_engine
def test_strict_mode_makes_an_unwritten_tensor_an_error(models, tmp_path):
    out = run_scenarios(tmp_path, {"skip_layer": models["llama"]}, {"NRL_SHIM_STRICT": "1"})["skip_layer"]
    assert out["error"] is not None and "RefitIncompleteError" in out["error"], out
    assert (
        "model.layers.1.input_layernorm.weight" in out["error"] and "NRL_SHIM_DISABLE=vllm-refit-guard" in out["error"]
    )


# vLLM's model objects built on CPU with the regular wheel (tests/children/vllm_model_objects.py): 0.8.5 - 0.10.x
# build here; 0.11+ CUDA wheels don't import their model classes without a GPU. The CPU build repacks linear weights
# (a direct load_weights refit fails there): the engine tests above cover it.
MODEL_OBJECTS = pytest.mark.skipif(
    VLLM.distribution != "vllm" or VLLM.version is None or Version(VLLM.version) >= Version("0.11"),
    reason=f"vLLM's model objects build on CPU from the regular wheels 0.8.5 - 0.10.x (installed: {VLLM.describe()})",
)


def run_model_child(tmp_path, env):
    model = str(tmp_path / "gemma")
    run_child_json("vllm_model_objects", "--write", model, timeout=300)  # without the shim: it is not under test here
    # V0: vLLM 0.8.x's V1 refuses float32, and this model is float32 so that it matches transformers exactly.
    env = {"NRL_SHIM": "1", "NRL_VLLM_USE_V1": "0" if _affected() else "1", **env}
    return run_child_json("refit_guard_model", model, env=env, timeout=900, cwd=tmp_path)[0]


def _affected():
    return VLLM.version is not None and Version(VLLM.version) < Version("0.9.2")


@MODEL_OBJECTS
def test_gemma_dummy_refit_without_the_gemma_fix(tmp_path):
    out = run_model_child(tmp_path, {"NRL_SHIM_GEMMA_LOAD_FORMAT": "off"})
    assert out["load_format"] == "dummy" and out["guarded"], out
    if _affected():  # the persistent normalizer buffer: randomised by dummy init, never sent by a refit
        (warning,) = out["warnings"]  # two generation steps: reported once
        assert reported_names(warning) == ["model.normalizer"]
        assert "Gemma3ForCausalLM" in warning and "NRL_SHIM_GEMMA_LOAD_FORMAT" in warning
    else:  # fixed upstream: the buffer is non-persistent, nothing is left dummy
        assert out["warnings"] == [], out


@MODEL_OBJECTS
def test_gemma_with_the_gemma_fix_loads_real_weights_and_the_guard_stays_silent(tmp_path):
    out = run_model_child(tmp_path, {})
    assert out == {"load_format": "auto", "guarded": False, "warnings": [], "error": None}
