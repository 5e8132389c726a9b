"""Tiny causal LMs written to disk with the installed transformers (random weights, safetensors): real checkpoints
for real engines, with nothing downloaded. Same shapes as nrl_shim/explain/tiny_configs.py."""

from __future__ import annotations

import json
import os

from nrl_shim.explain.tiny_configs import CONFIGS

# Wider than transformers' default init (0.02), so greedy tokens don't hinge on near-ties between vLLM's kernels and
# transformers' (both in float32).
INIT_STD = 0.3


def write_tokenizer(directory: str, vocab_size: int) -> None:
    """A word-level tokenizer ("t0" ... "t<n-1>", split on spaces) as a generic fast tokenizer: for engines that load
    one even with skip_tokenizer_init (vLLM 0.9's V1 LLMEngine does). Built with the `tokenizers` library."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0", "eos_token": "t1"}, f)


def write_model(
    directory: str,
    kind: str,
    seed: int = 0,
    tie_word_embeddings: bool = False,
    overrides: dict | None = None,
    tokenizer: bool = False,
) -> str:
    """A checkpoint of CONFIGS[kind] (a *ForCausalLM), `overrides` applied to its config, in `directory` (with a
    word-level tokenizer when `tokenizer`); returns it. Reuses one already written."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = str(directory)
    if os.path.isfile(os.path.join(directory, "model.safetensors")):
        return directory
    os.makedirs(directory, exist_ok=True)
    config = dict(
        CONFIGS[kind], initializer_range=INIT_STD, torch_dtype="float32", tie_word_embeddings=tie_word_embeddings
    )
    if "sliding_window" in config:
        config["sliding_window"] = 64  # longer than any test sequence; transformers 5 can't run with None
    config.update(overrides or {})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory), torch_dtype=torch.float32)
    model.save_pretrained(directory, safe_serialization=True)
    if tokenizer:
        write_tokenizer(directory, config["vocab_size"])
    return directory


def greedy_tokens(
    directory: str, prompts: list[list[int]], max_new_tokens: int, dtype: str = "float32"
) -> list[list[int]]:
    """transformers' greedy continuation of each prompt (token ids), the reference the engines must match; `dtype`
    that of the engine (a bfloat16 engine is compared with transformers in bfloat16)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=getattr(torch, dtype)).eval()
    out = []
    with torch.no_grad():  # plain argmax over full forwards: no generation config or cache involved
        for prompt in prompts:
            ids = list(prompt)
            for _ in range(max_new_tokens):
                logits = model(torch.tensor([ids])).logits[0, -1]
                ids.append(int(logits.argmax()))
            out.append(ids[len(prompt) :])
    return out


def state_dict_items(directory: str):
    """The checkpoint's (name, tensor) pairs, as an RL refit sends them."""
    from safetensors.torch import load_file

    return list(load_file(os.path.join(directory, "model.safetensors")).items())
