"""vllm-strict-tool-calling: the sampling vLLM builds for chat requests with one tool.
- vLLM's own request preparation, no engine (tests/children/strict_tool_requests.py: the hermes parser vLLM's OpenAI
  server builds, Parser.adjust_request): without the shim every `tool_choice="auto"` request that vLLM's default puts
  a grammar on has an xgrammar structural tag, `parallel_tool_calls=false` included; with it that one is sampled
  freely while a request whose tool says `strict: true` keeps its tag, as `"required"` does; the user's
  VLLM_ENFORCE_STRICT_TOOL_CALLING and NRL_SHIM_SAMPLING_DEFAULTS=serving keep vLLM's grammars.
- vLLM's OpenAI server (the shared runs in tests/vllm_sampling_runs.py): the same, read from vLLM's own request log,
  and the `required` reply's text in hermes' tag.
"""

import pytest
from vllm_sampling_runs import checkpoint, engine_run, lines_of, served

from conftest import run_child_json
from vllm_helpers import real_engine

ID = "vllm-strict-tool-calling"
STRICT = "VLLM_ENFORCE_STRICT_TOOL_CALLING"
VLLM_DEFAULT = {"auto_strict_tool": ["structural_tag"], "auto_single_call": ["structural_tag"], "auto": None}
LIFTED = {"auto_strict_tool": ["structural_tag"], "auto_single_call": None, "auto": None}


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
    # A strict tool's grammar and "required"'s stay vLLM's own; parallel_tool_calls=false alone puts none.
    assert shimmed["tools"] == {
        "required": ["structural_tag"],
        "auto_strict_tool": ["structural_tag"],
        "auto_single_call": None,
    }, shimmed
    lines = lines_of(ID, shimmed["shim_lines"])
    assert len(lines) == 1 and "-> 'none'" in lines[0] and "'required' and named" in lines[0], lines
    assert engine_run(True)["strict_tool_calling"] is None  # the variable is left to the user, in every process
