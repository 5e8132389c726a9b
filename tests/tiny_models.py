"""Tiny causal LMs written to disk with the installed transformers (random weights, safetensors): real checkpoints
for real engines, with nothing downloaded. Same shapes as nrl_shim/explain/tiny_configs.py."""

from __future__ import annotations

import json
import os

from nrl_shim.explain.tiny_configs import CONFIGS

# Tiny mixture-of-experts models (not in explain's CONFIGS: no explain demo uses them). The CPU attention kernels
# refuse head_dim 16/32 for these; 8 experts, top-2, 2 layers. Qwen2-MoE adds a shared expert and its gate.
_MOE = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "intermediate_size": 128,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
MOE_CONFIGS = {
    "qwen3_moe": dict(_MOE, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", norm_topk_prob=True),
    "qwen2_moe": dict(
        _MOE,
        architectures=["Qwen2MoeForCausalLM"],
        model_type="qwen2_moe",
        shared_expert_intermediate_size=64,
        decoder_sparse_step=1,
    ),
}

# Wider than transformers' default init (0.02), so greedy tokens don't hinge on near-ties between vLLM's kernels and
# transformers' (both in float32).
INIT_STD = 0.3


def write_tokenizer(directory: str, vocab_size: int, chat_template: str | None = None) -> None:
    """A word-level tokenizer ("t0" ... "t<n-1>", split on spaces) as a generic fast tokenizer: for engines that load
    one even with skip_tokenizer_init (vLLM 0.9's V1 LLMEngine does), with `chat_template` when given. Built with the
    `tokenizers` library."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0", "eos_token": "t1"}
    if chat_template is not None:
        config["chat_template"] = chat_template
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


def write_byte_tokenizer(directory: str, vocab_size: int, chat_template: str | None = None) -> None:
    """A byte-level tokenizer (the 256 byte symbols, no merges; `<tool_call>`/`</tool_call>` as tokens; plain added
    tokens up to `vocab_size`), for engines that must emit any text: a grammar (JSON, a tool-call tag) can always be
    followed, which a word-level vocabulary can't. Built with the `tokenizers` library; eos is id 2."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={symbol: i for i, symbol in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(tag, special=False, normalized=False) for tag in ("<tool_call>", "</tool_call>")]
    )
    tokenizer.add_tokens(
        [AddedToken(f"<x{i}>", normalized=False) for i in range(tokenizer.get_vocab_size(), vocab_size)]
    )
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": alphabet[2]}
    if chat_template is not None:
        config["chat_template"] = chat_template
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)


def write_model(
    directory: str,
    kind: str,
    seed: int = 0,
    tie_word_embeddings: bool = False,
    overrides: dict | None = None,
    tokenizer: bool = False,
    chat_template: str | None = None,
) -> str:
    """A checkpoint of CONFIGS[kind] (a *ForCausalLM), `overrides` applied to its config, in `directory` (with a
    word-level tokenizer when `tokenizer`, and `chat_template` in it when given); returns it. Reuses one already
    written."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    directory = str(directory)
    if os.path.isfile(os.path.join(directory, "model.safetensors")):
        return directory
    os.makedirs(directory, exist_ok=True)
    config = dict(
        {**CONFIGS, **MOE_CONFIGS}[kind],
        initializer_range=INIT_STD,
        torch_dtype="float32",
        tie_word_embeddings=tie_word_embeddings,
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
        write_tokenizer(directory, config["vocab_size"], chat_template)
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


def teacher_forced_gaps(
    directory: str, prompts: list[list[int]], outputs: list[list[int]], logprobs: list[list[float]]
) -> list[float]:
    """Per prompt, how far an engine's greedy continuation (`outputs`, with the logprob the engine returned for each
    token) is from transformers' float32 forward of the checkpoint, fed the same tokens: the largest of |engine
    logprob - transformers' logprob of that token| and (transformers' best logprob - that token's). 0 when the engine
    computes what transformers does; near-ties between kernels stay small, where greedy token lists would differ."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).eval()
    gaps = []
    with torch.no_grad():
        for prompt, tokens, engine in zip(prompts, outputs, logprobs):
            ids = torch.tensor([list(prompt) + list(tokens)])
            logits = model(ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
            reference = torch.log_softmax(logits.float(), dim=-1)
            chosen = reference[torch.arange(len(tokens)), torch.tensor(tokens)]
            off = (chosen - torch.tensor(engine, dtype=torch.float32)).abs()
            behind = reference.max(dim=-1).values - chosen
            gaps.append(float(torch.maximum(off, behind).max()))
    return gaps


def write_lora_adapter(directory: str, base: str, seed: int = 0, rank: int = 8, std: float = 0.3) -> str:
    """A PEFT-format LoRA adapter (adapter_config.json + adapter_model.safetensors, written by hand: no peft needed) on
    q/k/v/o of every layer of the checkpoint at `base` (a Llama-like config), random N(0, std) A and B; returns it."""
    import torch
    from safetensors.torch import save_file

    with open(os.path.join(base, "config.json")) as f:
        config = json.load(f)
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    shapes = {  # (out, in) of each projection
        "q_proj": (config["num_attention_heads"] * head_dim, hidden),
        "k_proj": (config["num_key_value_heads"] * head_dim, hidden),
        "v_proj": (config["num_key_value_heads"] * head_dim, hidden),
        "o_proj": (hidden, config["num_attention_heads"] * head_dim),
    }
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (out, inp) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, inp, generator=generator) * std
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=generator) * std
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(shapes),
        "fan_in_fan_out": False,
        "modules_to_save": None,
    }
    with open(os.path.join(directory, "adapter_config.json"), "w") as f:
        json.dump(adapter_config, f)
    return str(directory)
