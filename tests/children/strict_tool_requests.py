"""vLLM's own request preparation for tool calls (no engine), for test_vllm_strict_tool_calling.py:
`python strict_tool_requests.py TOKENIZER_DIR`. Activates the shim when NRL_SHIM=1 (as `import nrl_shim` does), builds
the parsers vLLM's OpenAI server builds for `--enable-auto-tool-choice --tool-call-parser hermes` and `... glm47`
(ParserManager.get_parser; glm47's default tool strict level is FUNCTION: vLLM's default puts a grammar on every `auto`
request with tools), and runs Parser.adjust_request, what the server runs on every chat request, on requests with one
tool. Prints one JSON line: {"kinds": {name: [structured_outputs kinds set] or None}, "lines": [shim log],
"strict_env": VLLM_ENFORCE_STRICT_TOOL_CALLING as the requests were prepared}; glm47's requests are `glm47_<name>`.
"""

import json
import logging
import os
import sys

lines = []


class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())


logging.getLogger("nrl_shim").addHandler(Keep())
if os.environ.get("NRL_SHIM") == "1":
    import nrl_shim

    nrl_shim.activate()

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.parser.parser_manager import ParserManager  # noqa: E402
from vllm.tokenizers import get_tokenizer  # noqa: E402

FUNCTION = {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
REQUESTS = {
    "auto_strict_tool": {"tool_choice": "auto", "strict": True},  # the request's own choice: its grammar stays
    "auto_single_call": {"tool_choice": "auto", "parallel_tool_calls": False},  # one call: vLLM keeps it by a grammar
    "required": {"tool_choice": "required"},
    "auto": {"tool_choice": "auto"},
}

tokenizer = get_tokenizer(sys.argv[1])
kinds = {}
for parser, name, fields in [
    *(("hermes", name, fields) for name, fields in REQUESTS.items()),
    *(("glm47", f"glm47_{name}", REQUESTS[name]) for name in ("auto", "auto_single_call")),
]:
    parser_class = ParserManager.get_parser(tool_parser_name=parser, enable_auto_tools=True)
    function = {**FUNCTION, **({"strict": True} if fields.get("strict") else {})}
    body = {key: value for key, value in fields.items() if key != "strict"}
    request = ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[{"type": "function", "function": function}],
        **body,
    )
    adjusted = parser_class(tokenizer, request.tools).adjust_request(request)
    outputs = adjusted.structured_outputs
    kinds[name] = None if outputs is None else sorted(k for k, v in vars(outputs).items() if v not in (None, False))
print(json.dumps({"kinds": kinds, "lines": lines, "strict_env": os.environ.get("VLLM_ENFORCE_STRICT_TOOL_CALLING")}))
