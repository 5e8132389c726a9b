"""TRL 1.16's GRPOTrainer, colocate mode, end to end on vLLM's CPU build: TRL's own engine and refits, unmodified.

Three runs of real training code (2 GRPO steps on a tiny Llama with a local word-level tokenizer), each in a fresh
process tree as a user starts it:
- `nrl-shim run -- python tests/children/trl_grpo_train.py ...` (a user's script, no nrl_shim in it) with
  NRL_SHIM_RECIPE=grpo-deepscaler-1.5b-8K: it trains; after a final `sync_weights()` the engine's logprobs are the
  trained policy's, not the initial weights' (the vllm-cpu-refit fix: TRL refits through `model.load_weights`); the
  engine is eager (vllm-eager-recipes; TRL passes no enforce_eager, so vLLM's default False).
- the same script without the shim: TRL's first refit raises vLLM's AttributeError (the CPU build packed the linear
  weights and dropped their parameters). The test fails if it does not: the fix would then prove nothing.
- `nrl-shim run -- trl grpo --config <dir>/grpo-deepscaler-1.5b-8K.yaml`: TRL's own CLI and script (accelerate launch,
  a local dataset, the reward by dotted path), the recipe detected from that command line as from NeMo RL's `--config`.

TRL's engine loads real weights (no load_format) inside the training process
(`distributed_executor_backend="external_launcher"`) and refits them: the CPU fix's default (`refit`) covers such
engines, no setting needed. TRL refits before each generation: after the last step the engine is
one update behind until `sync_weights()`, which the script calls.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import CHILDREN_DIR, SOURCE_ROOT, child_env, child_path
from vllm_helpers import REAL_ENGINE

pytestmark = [
    *REAL_ENGINE,
    pytest.mark.skipif(
        importlib.util.find_spec("trl") is None,
        reason="needs trl (TRL 1.16.0), not installed here; `nox -s frameworks` runs it",
    ),
]

RECIPE = "grpo-deepscaler-1.5b-8K"
BIN = os.path.dirname(sys.executable)
# vLLM's CI switch skips the slow inductor compile of a non-eager engine; TRL sets VLLM_LOGGING_LEVEL=ERROR unless it
# is set: INFO shows vLLM's engine config.
ENV = {
    "VLLM_CPU_CI_ENV": "1",
    "VLLM_LOGGING_LEVEL": "INFO",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
REFIT_ERROR = "AttributeError: 'Parameter' object has no attribute 'weight_loader'"
EAGER_LINE = f"[vllm-eager-recipes] vllm enforce_eager for recipe {RECIPE}: False -> True"
CPU_REFIT_LINE = (
    "[vllm-cpu-refit] vLLM CPU build: linear layers of an in-process engine "
    "(distributed_executor_backend='external_launcher'): "
    "'packed kernel copy (weight parameter dropped)' -> 'live weight (torch.nn.functional.linear)'"
)
PREFIX_CACHE_IDLE_LINE = (
    "[vllm-prefix-cache-refit] vLLM prefix cache after a refit: nothing to change (the caller reset it itself after "
    "its refit, before the next step)"
)
# The engine is bf16 (TRL's dtype="auto" on a float32 checkpoint, on a CPU); the policy is compared in bf16 too.
BF16_GAP = 0.3  # measured 0.08
MOVED = 2.0  # the initial weights' gap, measured 11.4; the engine before the final sync, measured 6.2


def run(argv, tmp_path, env, timeout=600):
    proc = subprocess.run(argv, env=child_env(env), capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    return proc, proc.stdout + proc.stderr


def train(tmp_path, model, shim, env):
    result = tmp_path / "result.json"
    command = [sys.executable, child_path("trl_grpo_train"), model, str(tmp_path / "out"), str(result)]
    if shim:
        command = [os.path.join(BIN, "nrl-shim"), "run", "--", *command]
    proc, output = run(command, tmp_path, dict(ENV, NRL_SHIM="1" if shim else "0", **env))
    return proc, output, json.loads(result.read_text()) if result.exists() else None


def tail(output):
    return output[-6000:]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tiny_models import write_model

    return write_model(tmp_path_factory.mktemp("trl") / "policy", "llama", tokenizer=True)


@pytest.fixture(scope="module")
def under_the_shim(model, tmp_path_factory):
    return train(tmp_path_factory.mktemp("shim"), model, True, {"NRL_SHIM_RECIPE": RECIPE})


@pytest.fixture(scope="module")
def without_the_shim(model, tmp_path_factory):
    return train(tmp_path_factory.mktemp("plain"), model, False, {})


def test_grpo_trains_and_the_engine_follows_the_policy_under_the_shim(under_the_shim):
    proc, output, result = under_the_shim
    assert proc.returncode == 0 and result, tail(output)
    assert result["global_step"] == 2
    assert [entry["step"] for entry in result["history"] if "loss" in entry] == [1, 2]
    assert result["engine"]["dtype"] == "torch.bfloat16" and result["engine"]["load_format"] == "auto"
    # After sync_weights() the engine computes the trained policy's logprobs (its own greedy tokens), within bf16...
    assert result["gap_to_policy"] < BF16_GAP, result
    # ...and not the initial weights': TRL's refits reached the engine. Before that last sync it was a step behind.
    assert result["gap_to_initial"] > MOVED and result["stale_gap_to_policy"] > MOVED, result
    assert result["engine_tokens"] != result["initial_greedy_bf16"]
    assert output.count(CPU_REFIT_LINE) == 1, tail(output)


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    from tiny_models import write_model

    return write_model(tmp_path_factory.mktemp("trl_moe") / "policy", "qwen3_moe", tokenizer=True)


@pytest.fixture(scope="module")
def moe_under_the_shim(moe_model, tmp_path_factory):
    return train(tmp_path_factory.mktemp("moe_shim"), moe_model, True, {})


@pytest.fixture(scope="module")
def moe_without_the_fix(moe_model, tmp_path_factory):
    # Today's shim without vllm-layerwise-refit: vllm-cpu-refit keeps the linear layers live, so TRL's refits succeed.
    return train(tmp_path_factory.mktemp("moe_plain"), moe_model, True, {"NRL_SHIM_DISABLE": "vllm-layerwise-refit"})


def test_a_moe_policy_trains_and_the_engine_follows_it_under_the_shim(moe_under_the_shim):
    # A tiny Qwen3-MoE policy (8 experts, top-2): TRL sends transformers 5's fused expert tensors one per call; the
    # shim runs each refit through vLLM's layerwise reload and the CPU build's experts are prepacked again.
    proc, output, result = moe_under_the_shim
    assert proc.returncode == 0 and result, tail(output)
    assert result["global_step"] == 2
    # bfloat16 on both sides: the typical token is within rounding (median measured 0.04 on a CPU with AMX, whose bf16
    # grouped-GEMM experts differ most from transformers'); a near-tie can flip the routing or the token at one
    # position (max measured 1.59 there, 0.10 without AMX), while a scrambled engine is off by > 10 everywhere.
    gaps = sorted(gap for row in result["gaps_to_policy"] for gap in row)
    assert gaps[len(gaps) // 2] < BF16_GAP / 3 and result["gap_to_policy"] < MOVED, result["gaps_to_policy"]
    assert result["gap_to_initial"] > MOVED and result["stale_gap_to_policy"] > MOVED, result
    assert output.count("[vllm-layerwise-refit] refit of Qwen3MoeForCausalLM") == 1, tail(output)
    assert output.count("[vllm-layerwise-refit] vLLM CPU build: fused-MoE experts on a weight update") == 1


def test_without_the_fix_trls_moe_engine_is_silently_scrambled(moe_without_the_fix):
    proc, output, result = moe_without_the_fix
    # It trains, no error anywhere, yet the engine's logprobs are neither the policy's nor the initial weights'.
    assert proc.returncode == 0 and result, tail(output)
    assert result["gap_to_policy"] > MOVED, result  # measured 15.5: the failure the fix is for must reproduce
    assert "[vllm-layerwise-refit]" not in output


def test_the_recipe_makes_trls_engine_eager(under_the_shim):
    proc, output, result = under_the_shim
    assert proc.returncode == 0 and result, tail(output)
    assert output.count(EAGER_LINE) == 1, tail(output)  # False: what TRL passes (nothing), vLLM's default
    assert result["engine"]["enforce_eager"] is True


def test_trl_asks_for_processed_logprobs_itself_so_that_fix_stays_idle(under_the_shim):
    proc, output, result = under_the_shim
    assert proc.returncode == 0 and result, tail(output)
    line = "[vllm-trainer-logprobs] vllm logprobs_mode: nothing to change (the caller asked for processed_logprobs"
    assert output.count(line) == 1, tail(output)
    assert "[vllm-trainer-logprobs] vllm logprobs_mode: 'raw_logprobs'" not in output
    # TRL seeds its engine itself (seed=process_index // tensor_parallel_size): vllm-replica-seed keeps it, once.
    assert output.count("[vllm-replica-seed] vllm seed: nothing to change (the caller set seed=") == 1, tail(output)


def test_trl_resets_the_prefix_cache_after_its_refits_so_that_fix_stays_idle(under_the_shim):
    proc, output, result = under_the_shim
    assert proc.returncode == 0 and result, tail(output)
    # TRL's sync_weights ends with llm.reset_prefix_cache(): the shim sees the refit, then TRL's own reset, and says so
    # once; no second reset (no line of its own reset).
    assert output.count(PREFIX_CACHE_IDLE_LINE) == 1, tail(output)
    assert "[vllm-prefix-cache-refit] vLLM prefix cache after a refit: stale blocks" not in output


def cpu_packs_bf16_weights():
    """Whether vLLM's CPU build packs bf16 linear weights on this CPU (AMX or AVX512-BF16: its sgl-kernel/oneDNN bf16
    GEMMs). Without either, it keeps them live and TRL's bf16 engine refits fine: the bug does not exist there."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return True
    return any(flag in flags for flag in ("amx_bf16", "avx512_bf16"))


def test_without_the_shim_trls_first_refit_fails_on_the_cpu_build(without_the_shim):
    proc, output, result = without_the_shim
    if proc.returncode == 0 and REFIT_ERROR not in output and not cpu_packs_bf16_weights():
        pytest.skip("this CPU has neither AMX nor AVX512-BF16: vLLM keeps TRL's bf16 weights live, no failure to show")
    # The failure the fix is for must happen here, or the test above proves nothing.
    assert proc.returncode != 0 and result is None, tail(output)
    assert REFIT_ERROR in output, tail(output)
    traceback = output[output.index("Traceback (most recent call last)") :]
    # TRL's refit before its first generation, one tensor per model.load_weights call, into vLLM's packed layers.
    assert "trl/generation/vllm_generation.py" in traceback and "in sync_weights" in traceback
    assert "vllm/model_executor/layers/linear.py" in traceback
    assert "'loss'" not in output  # no step finished
    assert "[vllm-cpu-refit]" not in output and "[vllm-eager-recipes]" not in output


def test_trl_cli_config_named_after_a_recipe_is_detected(model, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    with open(data / "train.jsonl", "w") as f:
        for a, b, c in [(5, 17, 42), (100, 3, 9), (7, 8, 9)] * 4:
            f.write(json.dumps({"prompt": f"t{a} t{b} t{c}"}) + "\n")
    config = {
        "model_name_or_path": model,
        "dataset_name": str(data),  # a local folder: datasets' json builder, split "train"
        "reward_funcs": ["trl_grpo_train.even_token_reward"],  # a dotted path, on PYTHONPATH below
        "output_dir": str(tmp_path / "out"),
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": 0.05,
        "vllm_max_model_length": 128,
        "use_cpu": True,
        "bf16": False,
        "max_steps": 2,
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 8,
        "learning_rate": 0.05,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
    }
    recipe = tmp_path / "recipes" / f"{RECIPE}.yaml"
    recipe.parent.mkdir()
    recipe.write_text("".join(f"{key}: {json.dumps(value)}\n" for key, value in config.items()))  # JSON values: YAML
    env = dict(
        ENV,
        PYTHONPATH=os.pathsep.join([SOURCE_ROOT, str(CHILDREN_DIR)]),
        HF_DATASETS_CACHE=str(tmp_path / "datasets-cache"),
    )
    command = [os.path.join(BIN, "nrl-shim"), "run", "--", os.path.join(BIN, "trl"), "grpo", "--config", str(recipe)]
    proc, output = run(command, tmp_path, env)
    assert proc.returncode == 0, tail(output)
    assert "Training completed." in output, tail(output)
    assert "'train_runtime'" in output and output.count("'loss'") == 2, tail(output)
    # Nothing set NRL_SHIM_RECIPE (child_env drops NRL_*): the shim read it from `trl grpo --config <recipe>.yaml`.
    assert output.count(EAGER_LINE) == 1, tail(output)
    assert "enforce_eager=True" in output, tail(output)  # vLLM's own engine-config line
    assert output.count(CPU_REFIT_LINE) == 1, tail(output)  # and TRL's refits in its own script went through
