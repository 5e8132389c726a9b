"""vllm-sampling-defaults on real engines (vLLM's CPU build; the runs in tests/vllm_sampling_runs.py, shared with
vllm-trainer-logprobs' and vllm-strict-tool-calling's tests): a GRPO group of 8 at temperature 1.0 through vLLM's
OpenAI server is one completion without the shim (the checkpoint's top_k 1), 8 with it; an in-process `LLM` given 8
requests without sampling params likewise, the eos id vLLM still takes from the file, and the explicit choices
(keyword arguments; vLLM's own command-line parser given `--generation-config auto` as verl passes its list, or a
`--config` file) kept with no change logged.
"""

from vllm_sampling_runs import SAMPLING, engine_run, lines_of, served

from vllm_helpers import real_engine

ID = "vllm-sampling-defaults"


@real_engine
def test_openai_server_group_of_8():
    plain = served(False)
    assert plain["distinct"] == 1, plain  # the bug: top_k 1 from the checkpoint, though the request asked T=1.0
    assert "top_p=0.001, top_k=1" in plain["group_params"], plain

    shimmed = served(True)
    assert shimmed["distinct"] == 8, shimmed
    assert "temperature=1.0" in shimmed["group_params"] and "top_p=1.0, top_k=0" in shimmed["group_params"], shimmed
    lines = lines_of(ID, shimmed["shim_lines"])
    kept = [line for line in lines if "generation_config" in line]
    assert len(kept) == 1 and "'auto' -> 'vllm'" in kept[0], lines  # one line, in the API server's process
    assert str(SAMPLING).replace("{", "").replace("}", "") in kept[0], kept  # names the values kept out


@real_engine
def test_llm_without_params_and_explicit_choices():
    plain = engine_run(False)
    bug = plain["cases"]["default"]
    assert bug["distinct"] == 1, bug  # checkpoint's top_k 1
    assert not lines_of(ID, (m for _, m in plain["log"])), plain

    out = engine_run(True)
    results, lines = out["cases"], lines_of(ID, (message for _, message in out["log"]))
    fixed = results["default"]
    assert fixed["generation_config"] == "vllm" and fixed["distinct"] == 8, fixed
    assert fixed["eos_token_id"] == bug["eos_token_id"] == 2, (fixed, bug)  # stopping still read from the file
    assert results["cli_default"]["generation_config"] == "vllm", results
    for name in ("explicit", "cli_explicit"):
        assert results[name]["generation_config"] == "auto", name
    assert results["explicit"]["distinct"] == 1, results["explicit"]
    assert results["cli_config_file"]["generation_config"] == "auto", results  # a --config file counts as chosen
    # One change line per engine that changed (default, cli_default), none for the explicit ones.
    assert sum("'auto' -> 'vllm'" in line for line in lines) == 1, lines  # same engine model: logged once a process
    assert not [line for line in lines if "'vllm' -> " in line], lines


def test_command_line_choices_are_read_from_the_argument_list():
    from nrl_shim.quirks.vllm._engine_args import options_named

    fields = ("generation_config", "logprobs_mode", "max_model_len", "override_generation_config")

    def named(argv):
        return options_named(argv, fields) & {"generation_config", "logprobs_mode"}

    both = frozenset({"generation_config", "logprobs_mode"})
    assert named(["serve", "m", "--max-model-len", "8"]) == frozenset()
    assert named(["--generation-config", "auto"]) == {"generation_config"}
    assert named(["--generation_config=auto", "--logprobs-mode", "raw_logprobs"]) == both
    assert named(["--logprobs_mode=raw_logprobs"]) == {"logprobs_mode"}
    assert named(["--config", "serve.yaml"]) == both  # vLLM's YAML may set either
    assert named(["--override-generation-config", '{"top_k": 20}']) == frozenset()
