"""vllm-trainer-logprobs on real engines (vLLM's CPU build; the runs in tests/vllm_sampling_runs.py, shared with
vllm-sampling-defaults' and vllm-strict-tool-calling's tests): the `logprobs` of completions and chat through vLLM's
OpenAI server at T in {0.7, 1.0} x top_p 0.8 / top_k 5 / min_p 0.1 against transformers' full-vocabulary
log_softmax(logits / T); an in-process `LLM`: logprobs at temperature 0.5, the same 6 truncating settings offline and
through an `AsyncLLM` (engine core in its own process), an explicit processed_logprobs (TRL's and verl's choice: kept,
renormalised, one warning), and the explicit choices (keyword arguments, vLLM's parser) kept.
"""

from vllm_sampling_runs import engine_run, lines_of, served

from vllm_helpers import real_engine

ID = "vllm-trainer-logprobs"


@real_engine
def test_openai_server_logprobs_after_temperature():
    plain = served(False)
    for route in ("completions", "chat"):  # raw logprobs: before temperature
        assert all(gap > 0.05 for name, gap in plain["truncated"][route].items() if name.startswith("T0.7")), plain

    shimmed = served(True)
    for route in ("completions", "chat"):  # the full-vocabulary log_softmax(logits / T), at every truncating setting
        gaps = shimmed["truncated"][route]
        assert len(gaps) == 6 and all(gap < 1e-4 for gap in gaps.values()), (route, gaps)
    lines = lines_of(ID, shimmed["shim_lines"])
    assert sum("logprobs_mode: 'raw_logprobs' -> 'processed_logprobs'" in line for line in lines) == 1, lines


@real_engine
def test_llm_logprobs_after_temperature_and_explicit_choices():
    plain = engine_run(False)
    bug = plain["cases"]["default"]
    assert bug["logprob_gap"] > 0.05, bug  # logprobs before T
    assert all(gap > 0.05 for name, gap in bug["truncated"].items() if name.startswith("T0.7")), bug  # before T
    assert not lines_of(ID, (m for _, m in plain["log"])), plain

    out = engine_run(True)
    results, lines = out["cases"], lines_of(ID, (message for _, message in out["log"]))
    fixed = results["default"]
    assert fixed["logprobs_mode"] == "processed_logprobs" and fixed["logprob_gap"] < 1e-4, fixed
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
    assert results["cli_default"] == {"generation_config": "vllm", "logprobs_mode": "processed_logprobs"}, results
    for name in ("explicit", "cli_explicit"):
        assert results[name]["logprobs_mode"] == "raw_logprobs", name
    assert results["explicit"]["logprob_gap"] > 0.05, results["explicit"]
    assert not [line for line in lines if "'raw_logprobs' -> 'auto'" in line], lines
    changed = [line for line in lines if "logprobs_mode: 'raw_logprobs' -> " in line]
    assert len(changed) == 1 and "full-vocabulary log_softmax(logits / T)" in changed[0], lines
    assert sum("'processed_logprobs' -> 'log_softmax(logits / T)'" in line for line in lines) == 1, lines
    assert sum("asked for processed_logprobs itself" in line for line in lines) == 1, lines
