"""torch's context parallel (CP) only shards attention that goes through torch.nn.functional.scaled_dot_product_attention.
transformers' flash-attention path (attn_implementation="flash_attention_2", which sequence packing needs) calls the
flash-attn kernels directly, so under CP each rank would attend only to its own chunk of the sequence. NeMo RL refuses
CP with sequence packing; the shim raises one clear error when that path is called inside a CP context, before any
flash kernel is needed. Every flash variant of transformers goes through `_flash_attention_forward`.
"""

import sys

from nrl_shim.quirks.torch_cp import TORCH_CP_SINCE, TORCH_CP_VERIFIED, TRANSFORMERS_CP, TRANSFORMERS_CP_SINCE
from nrl_shim.quirks.torch_cp._common import cp_targets

ID = "cp-flash-attention"
SUMMARY = "inside context_parallel: transformers' flash_attention_2 path (sequence packing) raises a clear error"
LINK = "https://github.com/NVIDIA-NeMo/RL/blob/main/docs/model-quirks.md#context-parallel-with-fsdp2"
LIBRARY = "transformers"
VERSIONS = TRANSFORMERS_CP_SINCE
ALSO_REQUIRES = {"torch": TORCH_CP_SINCE}  # the guard acts through torch's context_parallel
VERIFIED = {"transformers": TRANSFORMERS_CP, "torch": TORCH_CP_VERIFIED}
REQUIRES = (
    "torch.distributed.tensor.experimental._context_parallel._attention:context_parallel(mesh)",
    "transformers.modeling_flash_attention_utils:_flash_attention_forward",
)
_UTILS = "transformers.modeling_flash_attention_utils"
_NAME = "_flash_attention_forward"


def _flash_guard(wrapped, instance, args, kwargs):
    from nrl_shim.quirks.torch_cp import _common as _torch_cp

    if not _torch_cp.active():
        return wrapped(*args, **kwargs)
    from nrl_shim.errors import UnsupportedConfigError

    query = args[0] if args else kwargs.get("query_states")
    shape = (
        ""
        if not hasattr(query, "shape")
        else (f" (query of shape {tuple(query.shape)} [batch, sequence, heads, head_dim], dtype {query.dtype})")
    )
    raise UnsupportedConfigError(
        'context parallel: transformers\' flash-attention path (attn_implementation="flash_attention_2") was called '
        f"inside torch.distributed.tensor.experimental.context_parallel{shape}. torch's context parallel only shards "
        'attention computed by torch.nn.functional.scaled_dot_product_attention (attn_implementation="sdpa"); flash '
        "kernels are not sharded, so each rank would attend only to its own chunk of the sequence. Sequence packing "
        "needs flash_attention_2 and context parallel needs sdpa, so the two cannot be combined. What you can do: "
        'turn sequence packing off and load the model with attn_implementation="sdpa" to keep context parallel, or '
        "keep sequence packing and set the context-parallel size to 1. "
        f"To skip this check: NRL_SHIM_DISABLE={ID}."
    )


def _other_transformers_modules():
    # Modules that did `from ..modeling_flash_attention_utils import _flash_attention_forward` before we patched
    # (transformers imported before activation) hold their own copy of the name.
    return [mod for name, mod in list(sys.modules.items()) if name.startswith("transformers.") and name != _UTILS]


def patch_utils(module, settings):
    from nrl_shim.patching import rebind, wrap

    old = getattr(module, _NAME)
    wrap(module, _NAME, _flash_guard, ID)
    rebind(_other_transformers_modules(), _NAME, old, getattr(module, _NAME))


def unpatch_utils(module):
    from nrl_shim.patching import rebind, unwrap

    old = getattr(module, _NAME, None)
    unwrap(module, _NAME, ID)
    if old is not None and getattr(module, _NAME) is not old:
        rebind(_other_transformers_modules(), _NAME, old, getattr(module, _NAME))


# The CP modules only to know when a CP context is active; the flash-attention utils for the guard itself.
TARGETS = {**cp_targets(ID), _UTILS: (patch_utils, unpatch_utils)}


def describe(settings, version):
    what = "flash_attention_2 path inside context_parallel -> clear error (CP needs sdpa)"
    return f"transformers {version}: {what}"
