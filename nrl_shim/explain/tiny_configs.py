"""Tiny HF `config.json` files for real vLLM engine configs without downloads (explain's demo and the tests).

Written by hand (no transformers needed). `"sliding_window": null` keeps vLLM <= 0.11.0's CPU backend from refusing
sliding-window models when VLLM_USE_V1=1 is set explicitly (a CPU-backend limit, not a GPU one).
"""

import json
import os

_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
}

_GEMMA_TEXT = dict(
    _TEXT,
    sliding_window=None,
    query_pre_attn_scalar=32,
    hidden_activation="gelu_pytorch_tanh",
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)

CONFIGS = {
    "gemma2": dict(
        _GEMMA_TEXT,
        architectures=["Gemma2ForCausalLM"],
        model_type="gemma2",
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
    ),
    "gemma3_text": dict(
        _GEMMA_TEXT,
        architectures=["Gemma3ForCausalLM"],
        model_type="gemma3_text",
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        sliding_window_pattern=6,
    ),
    "gemma3": {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": dict(
            _GEMMA_TEXT,
            model_type="gemma3_text",
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            sliding_window_pattern=6,
        ),
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 56,
            "patch_size": 14,
        },
        "mm_tokens_per_image": 4,
        "boi_token_index": 255,
        "eoi_token_index": 256,
        "image_token_index": 257,
        "torch_dtype": "bfloat16",
    },
    "llama": dict(
        _TEXT,
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
    ),
}


# The sampling values a released checkpoint ships in its generation_config.json (Qwen2.5-VL-7B-Instruct's, cited in
# NVIDIA-NeMo/RL#3497): the demo's checkpoints carry them, so that `explain --demo` shows what vLLM would fill into
# requests from them, and vllm-sampling-defaults keeping them out.
DEMO_GENERATION_CONFIG = {"do_sample": True, "temperature": 0.1, "top_k": 1, "top_p": 0.001}


def write_config(directory, kind, generation_config=None):
    """Write CONFIGS[kind] as directory/config.json (and `generation_config` as generation_config.json); return the
    directory (a str)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(CONFIGS[kind], f, indent=1)
    if generation_config is not None:
        with open(os.path.join(directory, "generation_config.json"), "w") as f:
            json.dump(generation_config, f, indent=1)
    return str(directory)
