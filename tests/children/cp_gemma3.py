"""One rank of the cp-gemma3 scenario (started by cp_helpers.run_ranks): tiny Gemma-3 and Llama forwards inside and
outside a real context_parallel context, counting the SDPA calls, in each phase of CP_TEST_PHASES."""

# isort: off
import nrl_shim
from cp_helpers import (
    context_parallel,
    finish,
    init,
    outcome,
    phases,
    sdpa_is_torchs,
    tiny_gemma3,
    tiny_gemma3_multimodal,
    tiny_llama,
)
import functools
import torch

# isort: on

rank, ws, mesh = init()
WINDOW = 4
gemma, llama = tiny_gemma3(sliding_window=WINDOW), tiny_llama()


def forward(model, seq, cp=True):
    ids = torch.arange(seq).view(1, seq) % 100
    if not cp:
        return model(input_ids=ids).logits
    with context_parallel(mesh, ids):
        return model(input_ids=ids).logits


def attention_calls(fn):
    # How many times SDPA was reached (the guard must fire before any attention runs).
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention

    @functools.wraps(original)  # CP re-installs F.<__name__>: keep the name
    def counting(*a, **k):
        calls.append(1)
        return original(*a, **k)

    import transformers.integrations.sdpa_attention as sdpa_module

    sdpa_module.torch.nn.functional.scaled_dot_product_attention = counting
    try:
        return {"outcome": outcome(fn), "sdpa_calls": len(calls)}
    finally:
        sdpa_module.torch.nn.functional.scaled_dot_product_attention = original


def cases():
    settings = nrl_shim.active_settings()
    results = {
        # Longer than the window: the sliding layers pass a mask. Shorter: they pass none (local length under CP).
        "gemma_short": attention_calls(lambda: forward(gemma, 2 * ws)),
        "llama": outcome(lambda: forward(llama, 16)),
        "gemma_outside": outcome(lambda: forward(gemma, 16, cp=False)),
    }
    if settings.is_enabled("cp-attention-mask"):  # unguarded, torch's masked DTensor CPU fallback takes minutes
        results["gemma_long"] = outcome(lambda: forward(gemma, 16))
    if settings.is_enabled("cp-gemma3"):
        results["gemma_long_counted"] = attention_calls(lambda: forward(gemma, 16))
        results["conditional_generation"] = outcome(lambda: forward(tiny_gemma3_multimodal(), 16))
    results["sdpa_restored"] = sdpa_is_torchs()
    return results


finish(phases(cases))
