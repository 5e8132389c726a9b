"""Gemma-3 under torch context parallel (CP) cannot work: its sliding-window layers pass an attention mask to SDPA once
the sequence is longer than the window, and torch's CP supports SDPA only without a mask (NeMo RL asserts on it).
A Gemma-3 forward started inside a CP context raises one clear error before any attention runs.
"""

from nrl_shim.quirks.torch_cp import TORCH_CP_SINCE, TORCH_CP_VERIFIED, TRANSFORMERS_CP, TRANSFORMERS_CP_SINCE
from nrl_shim.quirks.torch_cp._common import cp_targets

ID = "cp-gemma3"
SUMMARY = (
    "inside context_parallel: a Gemma-3 forward raises a clear error before any attention runs (NeMo RL refuses it)"
)
LINK = "https://github.com/NVIDIA-NeMo/RL/blob/main/docs/model-quirks.md#context-parallel-with-fsdp2"
LIBRARY = "transformers"
VERSIONS = TRANSFORMERS_CP_SINCE
ALSO_REQUIRES = {"torch": TORCH_CP_SINCE}  # the guard acts through torch's context_parallel
VERIFIED = {"transformers": TRANSFORMERS_CP, "torch": TORCH_CP_VERIFIED}
REQUIRES = (
    "torch.distributed.tensor.experimental._context_parallel._attention:context_parallel(mesh)",
    "transformers.models.gemma3.modeling_gemma3:Gemma3ForCausalLM.forward",
)
_MODELING = "transformers.models.gemma3.modeling_gemma3"
_REQUIRED = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
_OPTIONAL = ("Gemma3TextModel", "Gemma3Model")  # the bare models (AutoModel, sequence classification heads)


def _forward_guard(wrapped, instance, args, kwargs):
    from nrl_shim.quirks.torch_cp import _common as _torch_cp

    if not _torch_cp.active():
        return wrapped(*args, **kwargs)
    from nrl_shim.errors import UnsupportedConfigError

    config = getattr(instance, "config", None)
    text_config = getattr(config, "text_config", None) or config
    window = getattr(text_config, "sliding_window", None)
    tokens = kwargs.get("input_ids", args[0] if args else None)
    tokens = "" if getattr(tokens, "shape", None) is None else f" (input_ids of local shape {tuple(tokens.shape)})"
    raise UnsupportedConfigError(
        f"context parallel: {type(instance).__name__}.forward was called inside "
        f"torch.distributed.tensor.experimental.context_parallel{tokens}. Gemma-3 cannot run under torch's context "
        f"parallel: its sliding-window attention layers (sliding_window={window}) pass an attention mask to SDPA "
        "(always once the sequence is longer than the window), and torch's context parallel only supports SDPA "
        "without a mask (NeMo RL refuses Gemma-3 with CP for the same reason). What you can do: set the "
        "context-parallel size to 1 for Gemma-3 models and use tensor parallelism and activation checkpointing for "
        "long sequences. "
        f"To skip this check: NRL_SHIM_DISABLE={ID}."
    )


def patch_modeling(module, settings):
    from nrl_shim.patching import wrap

    classes = [getattr(module, name) for name in _REQUIRED]  # AttributeError (unknown layout) before any change
    classes += [getattr(module, name) for name in _OPTIONAL if hasattr(module, name)]
    for cls in classes:
        wrap(cls, "forward", _forward_guard, ID)


def unpatch_modeling(module):
    from nrl_shim.patching import unwrap

    for name in _REQUIRED + _OPTIONAL:
        if hasattr(module, name):
            unwrap(getattr(module, name), "forward", ID)


# The CP modules only to know when a CP context is active; the modeling module for the guard itself.
TARGETS = {**cp_targets(ID), _MODELING: (patch_modeling, unpatch_modeling)}


def describe(settings, version):
    what = "Gemma-3 forward inside context_parallel -> clear error before any attention runs"
    return f"transformers {version}: {what}"
