"""vllm-strict-tool-calling: the sampling vLLM builds for chat requests with one tool.
- vLLM's own request preparation, no engine (tests/children/strict_tool_requests.py: the hermes and glm47 parsers
  vLLM's OpenAI server builds, Parser.adjust_request): without the shim glm47's default strict level puts an xgrammar
  structural tag on every `tool_choice="auto"` request; with it a plain `auto` request is sampled freely, while every
  explicit choice keeps its tag: a tool's own `strict: true`, `"required"`, `parallel_tool_calls=false` (vLLM keeps a
  request to one call by the grammar), the user's VLLM_ENFORCE_STRICT_TOOL_CALLING; NRL_SHIM_SAMPLING_DEFAULTS=serving
  keeps vLLM's grammars.
- vLLM's OpenAI server with hermes (the shared runs in tests/vllm_sampling_runs.py): every explicit choice keeps its
  grammar under the shim, read from vLLM's own request log, and the `required` reply's text in hermes' tag.
"""

import pytest
from vllm_sampling_runs import checkpoint, engine_run, lines_of, served

from conftest import run_child_json
from vllm_helpers import real_engine

ID = "vllm-strict-tool-calling"
STRICT = "VLLM_ENFORCE_STRICT_TOOL_CALLING"
TAG = ["structural_tag"]
VLLM_DEFAULT = {
    "auto_strict_tool": TAG,
    "auto_single_call": TAG,
    "auto": None,
    "glm47_auto": TAG,  # the parser's default strict level: the one grammar only vLLM's default puts there
    "glm47_auto_single_call": TAG,
}
LIFTED = {**VLLM_DEFAULT, "glm47_auto": None}  # parallel_tool_calls=false is the request's choice: kept


@real_engine
@pytest.mark.parametrize(
    "env, expected",
    [
        ({"NRL_SHIM": "0"}, VLLM_DEFAULT),  # the bug: a grammar on an `auto` request that chose none
        ({}, LIFTED),
        ({STRICT: "1"}, VLLM_DEFAULT),  # the user's choice: kept, nothing logged
        ({"NRL_SHIM_SAMPLING_DEFAULTS": "serving"}, VLLM_DEFAULT),  # vLLM's serving defaults: one idle line
    ],
    ids=["no-shim", "unset", "user-set", "serving"],
)
def test_request_keeps_its_own_strict_tool_and_loses_the_default_grammar(env, expected):
    out, _ = run_child_json(
        "strict_tool_requests", checkpoint(), env={"NRL_SHIM": "1", "NRL_SHIM_LOG_LEVEL": "INFO", **env}, timeout=300
    )
    kinds, lines = out["kinds"], lines_of(ID, out["lines"])
    assert kinds == {**expected, "required": ["structural_tag"]}, out  # "required": vLLM honours it by a grammar only
    assert out["strict_env"] == env.get(STRICT), out  # the shim no longer sets the variable
    if expected is LIFTED:
        assert len(lines) == 1 and "-> 'none'" in lines[0] and "strict: true" in lines[0], lines
    elif "NRL_SHIM_SAMPLING_DEFAULTS" in env:
        assert len(lines) == 1 and "nothing to change" in lines[0] and "serving" in lines[0], lines
    else:
        assert lines == [], lines


@real_engine
def test_openai_server_tool_calls():
    plain = served(False)
    assert plain["tools"] == {name: ["structural_tag"] for name in plain["tools"]}, plain
    assert plain["required_text"].startswith("<tool_call>"), plain  # hermes' tag, forced by the grammar

    shimmed = served(True)
    # Every explicit choice keeps vLLM's grammar: a strict tool, "required", parallel_tool_calls=false (hermes puts
    # none on a plain `auto` request: nothing for the fix to lift, nothing said).
    assert shimmed["tools"] == {"required": TAG, "auto_strict_tool": TAG, "auto_single_call": TAG}, shimmed
    assert lines_of(ID, shimmed["shim_lines"]) == [], shimmed["shim_lines"]
    assert engine_run(True)["strict_tool_calling"] is None  # the variable is left to the user, in every process
