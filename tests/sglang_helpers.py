"""Helpers for the tests on real SGLang engines (`nox -s sglang`): the installed release, the marks of such a test,
the environment of an engine's processes (the CPU harness in tests/sglang_cpu, README.md there), a tiny Llama
checkpoint and transformers' reference continuation."""

import importlib.metadata
import importlib.util
import os

import pytest

from conftest import SOURCE_ROOT

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(TESTS_DIR, "sglang_cpu")

try:
    SGLANG_VERSION: str | None = importlib.metadata.version("sglang")
except importlib.metadata.PackageNotFoundError:
    SGLANG_VERSION = None


def install_torchvision_ops() -> None:
    """The harness's torchvision fix in this process (the test process writes checkpoints and computes references with
    transformers, which imports torchvision where it is installed), loaded by path: the harness's sgl_kernel stand-in
    stays off this process's sys.path."""
    spec = importlib.util.spec_from_file_location("torchvision_ops", os.path.join(HARNESS, "torchvision_ops.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install()


if SGLANG_VERSION is not None:
    install_torchvision_ops()

REAL_SGLANG = [
    pytest.mark.sglang,
    pytest.mark.skipif(
        SGLANG_VERSION is None,
        reason="SGLang is not installed in this interpreter; `nox -s sglang` runs the SGLang engine tests",
    ),
]

# A CPU engine: SGLang's CPU platform (SGLANG_USE_CPU_ENGINE=1 in the environment, sglang_env), PyTorch attention, no
# CUDA graphs; float32 like the transformers reference; a small KV pool (the CPU default is sized from free memory).
ENGINE_KW = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "disable_cuda_graph": True,
    "dtype": "float32",
    "context_length": 1024,
    "max_total_tokens": 4096,
    "random_seed": 0,
    "log_level": "error",
}

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
# vocab 512, hidden 128, 2 layers (tests/tiny_models.py's Llama, widened), float32, room for 4096 positions (the
# server runs' long requests; an Engine's context is ENGINE_KW's).
LLAMA = {"hidden_size": 128, "head_dim": 64, "max_position_embeddings": 4096}


def sglang_env(extra: dict | None = None) -> dict:
    """The environment of an SGLang engine's processes under test (added to conftest.child_env): the harness first on
    PYTHONPATH (its sitecustomize and sgl_kernel stand-in), then this checkout; SGLang's CPU platform."""
    return {"PYTHONPATH": os.pathsep.join([HARNESS, SOURCE_ROOT]), "SGLANG_USE_CPU_ENGINE": "1", **(extra or {})}


def write_llama(directory, seed: int) -> str:
    from tiny_models import write_model

    return write_model(directory, "llama", seed=seed, overrides=LLAMA, tokenizer=True, chat_template=CHAT_TEMPLATE)


def reference(directory: str, prompt: list[int], max_tokens: int) -> dict:
    """transformers' greedy continuation of `prompt` and each chosen token's logprob (float32, full forwards)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids, logprobs = list(prompt), []
    with torch.no_grad():
        for _ in range(max_tokens):
            scores = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], dim=-1)
            token = int(scores.argmax())
            ids.append(token)
            logprobs.append(float(scores[token]))
    return {"tokens": ids[len(prompt) :], "logprobs": logprobs}


def greedy_choices(directory: str, prompt: list[int], tokens: list[int]) -> list[int]:
    """transformers' greedy choice at each of `tokens`' positions, after `prompt` and the tokens before it (one
    forward, float32): what an engine serving those tokens greedily with these weights picks there."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        return model(ids).logits[0, len(prompt) - 1 : -1].argmax(dim=-1).tolist()


def logprob_gap(rollout: dict, expected: dict) -> float:
    """The largest |engine logprob - reference logprob| over the tokens both chose alike up to the first difference
    (the first token's at least)."""
    gaps = []
    for got, want, got_lp, want_lp in zip(
        rollout["tokens"], expected["tokens"], rollout["logprobs"], expected["logprobs"]
    ):
        gaps.append(abs(got_lp - want_lp))
        if got != want:
            break
    return max(gaps)
