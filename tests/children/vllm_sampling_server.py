"""vLLM's OpenAI server (CPU build) of a tiny checkpoint whose generation_config.json carries sampling values, for
tests/vllm_sampling_runs.py: `python vllm_sampling_server.py MODEL_DIR PORT SERVER_ARGV.json`. Starts the server
(SERVER_ARGV: the command, e.g. `vllm serve MODEL` or `python -m vllm.entrypoints.openai.api_server --model MODEL`;
this file adds host, port and small-engine flags, the hermes tool parser and `--enable-log-requests`), then sends
- a GRPO group: `/v1/completions` with n=8, temperature 1.0, nothing else about sampling: distinct completions;
- three chat requests with one tool: `tool_choice="required"`, `"auto"` with a `strict` tool, `"auto"` with
  `parallel_tool_calls=false`: the sampling parameters vLLM built for each, read from its own request log
  ("Received request ...: params: SamplingParams(...)"), and the `required` reply's text.
- per truncating sampling setting (T in {0.7, 1.0} x top_p 0.8 / top_k 5 / min_p 0.1), a `/v1/completions` and a
  `/v1/chat/completions` request with 3 alternatives a token (token ids returned): the largest |returned logprob -
  transformers' full-vocabulary log_softmax(logits / T)| over every logprob returned.
Prints one JSON line: {"distinct", "group_params", "tools": {name: structured_outputs kind}, "required_text",
"truncated": {"completions": {setting: gap}, "chat": {...}}, "shim_lines", "startup_s"}. The server is stopped (its process group) whatever happens.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

ENGINE_FLAGS = ["--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--max-num-seqs", "8"]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TRUNCATING = {
    f"T{t}-{name}": {"temperature": t, name: value}
    for t in (0.7, 1.0)
    for name, value in (("top_p", 0.8), ("top_k", 5), ("min_p", 0.1))
}
TOOL_REQUESTS = {
    "required": {"tool_choice": "required"},
    "auto_strict_tool": {"tool_choice": "auto", "strict": True},
    "auto_single_call": {"tool_choice": "auto", "parallel_tool_calls": False},
}


def post(port, path, body):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)


def wait_until_up(port, server, log_path, timeout=480):
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if server.poll() is not None:
            raise SystemExit(f"server exited (rc={server.returncode}):\n{open(log_path).read()[-6000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return time.monotonic() - start
        except OSError:
            time.sleep(1)
    raise SystemExit(f"server not up after {timeout} s:\n{open(log_path).read()[-6000:]}")


def token_id(text):
    return int(text.split(":", 1)[1])  # return_tokens_as_token_ids: "token_id:<id>"


def gap(directory, prompt, steps, temperature):
    """steps: per generated token, [(token id, logprob), ...] (the sampled one first)."""
    import torch
    from transformers import AutoModelForCausalLM

    tokens = [step[0][0] for step in steps]
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    reference = torch.log_softmax(logits / temperature, -1)
    return max(abs(lp - reference[i, token].item()) for i, step in enumerate(steps) for token, lp in step)


def truncated_gaps(port, directory):
    gaps = {"completions": {}, "chat": {}}
    common = {"model": directory, "max_tokens": 8, "seed": 1, "ignore_eos": True, "return_tokens_as_token_ids": True}
    for name, setting in TRUNCATING.items():
        reply = post(
            port,
            "/v1/completions",
            {**common, **setting, "prompt": "Once upon", "logprobs": 3, "return_token_ids": True},
        )
        choice = reply["choices"][0]
        logprobs = choice["logprobs"]
        steps = [
            [(token_id(token), lp), *((token_id(t), v) for t, v in alternatives.items())]
            for token, lp, alternatives in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"])
        ]
        gaps["completions"][name] = gap(directory, choice["prompt_token_ids"], steps, setting["temperature"])
        messages = [{"role": "user", "content": "Once upon"}]
        reply = post(
            port,
            "/v1/chat/completions",
            {**common, **setting, "messages": messages, "logprobs": True, "top_logprobs": 3, "return_token_ids": True},
        )
        content = reply["choices"][0]["logprobs"]["content"]
        steps = [
            [
                (token_id(entry["token"]), entry["logprob"]),
                *((token_id(alt["token"]), alt["logprob"]) for alt in entry["top_logprobs"]),
            ]
            for entry in content
        ]
        gaps["chat"][name] = gap(directory, reply["prompt_token_ids"], steps, setting["temperature"])
    return gaps


def structured_kind(params):
    """What vLLM put in SamplingParams.structured_outputs: None, or the kinds set (json / structural_tag / ...)."""
    found = re.search(r"structured_outputs=(None|StructuredOutputsParams\((.*)\)), extra_args", params)
    if found is None or found.group(1) == "None":
        return None
    return sorted(set(re.findall(r"\b(json|regex|choice|grammar|json_object|structural_tag)=(?!None)", found.group(2))))


def main():
    directory, port, argv = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    log_path = os.path.join(os.getcwd(), f"server-{port}.log")
    command = [
        *argv,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *ENGINE_FLAGS,
        "--enable-log-requests",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        startup = wait_until_up(port, server, log_path)
        print(f"server up after {startup:.0f} s", file=sys.stderr, flush=True)
        group = post(
            port,
            "/v1/completions",
            {
                "model": directory,
                "prompt": "Once upon",
                "n": 8,
                "temperature": 1.0,
                "max_tokens": 8,
                "ignore_eos": True,
            },
        )
        replies = {}
        for name, request in TOOL_REQUESTS.items():
            tool = json.loads(json.dumps(TOOL))
            if request.get("strict"):
                tool["function"]["strict"] = True
            body = {
                "model": directory,
                "messages": [{"role": "user", "content": "Weather in Paris?"}],
                "tools": [tool],
                "tool_choice": request["tool_choice"],
                "max_tokens": 16,
                "temperature": 1.0,
            }
            if "parallel_tool_calls" in request:
                body["parallel_tool_calls"] = request["parallel_tool_calls"]
            replies[name] = post(port, "/v1/chat/completions", body)["choices"][0]["message"]
        truncated = truncated_gaps(port, directory)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    text = open(log_path).read()
    received = re.findall(r"Received request (\S+): params: (SamplingParams\(.*)", text)
    chat = [params for request_id, params in received if request_id.startswith("chatcmpl")]
    group_params = next(params for request_id, params in received if request_id.startswith("cmpl"))
    sampling = re.search(r"temperature=[^,]*, .*?top_p=[^,]*, top_k=[^,]*, min_p=[^,]*", group_params)
    print(
        json.dumps(
            {
                "distinct": len({choice["text"] for choice in group["choices"]}),
                "group_params": sampling.group(0) if sampling else group_params[:400],
                "tools": {name: structured_kind(params) for name, params in zip(TOOL_REQUESTS, chat)},
                "required_text": replies["required"].get("content") or "",
                "required_tool_calls": len(replies["required"].get("tool_calls") or []),
                "truncated": truncated,
                "shim_lines": [line for line in text.splitlines() if line.startswith("nrl_shim ")],
                "startup_s": round(startup, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
