"""torch's context parallel (CP) shards q/k/v along the sequence and has no rule for an attention mask or bias: a masked
SDPA call fails deep inside DTensor with errors that point nowhere ("Sharding dim 2 greater than tensor ndim 2",
"Attempting to broadcast a dimension of length ...", "attn_bias is not supported yet" on GPU), or, on torch 2.14 with
one rank, runs without complaint. While a CP context is active, the SDPA that CP installed is wrapped so that a call
with an attn_mask raises one clear error first; calls without a mask go to CP's function unchanged.
"""

from nrl_shim.quirks.torch_cp import TORCH_CP_SINCE, TORCH_CP_VERIFIED
from nrl_shim.quirks.torch_cp._common import cp_targets

ID = "cp-attention-mask"
SUMMARY = "inside context_parallel: SDPA called with an attn_mask raises a clear error (torch CP supports no mask/bias)"
LINK = "https://github.com/pytorch/pytorch/blob/134179474539648ba7dee1317959529fbd0e7f89/torch/distributed/tensor/experimental/_attention.py#L262"
LIBRARY = "torch"
VERSIONS, VERIFIED = TORCH_CP_SINCE, TORCH_CP_VERIFIED
REQUIRES = ("torch.distributed.tensor.experimental._context_parallel._attention:context_parallel(mesh)",)

_SDPA = "scaled_dot_product_attention"


def _describe_tensor(t):
    shape = getattr(t, "shape", None)
    return f"shape {tuple(shape)}, dtype {t.dtype}" if shape is not None else f"a {type(t).__name__}"


def _sdpa_guard(wrapped, instance, args, kwargs):
    mask = kwargs["attn_mask"] if "attn_mask" in kwargs else (args[3] if len(args) > 3 else None)
    if mask is None:
        return wrapped(*args, **kwargs)
    from nrl_shim.errors import UnsupportedConfigError

    query = args[0] if args else kwargs.get("query")
    raise UnsupportedConfigError(
        f"context parallel: scaled_dot_product_attention was called with an attn_mask ({_describe_tensor(mask)}; "
        f"query, local shard: {_describe_tensor(query)}) inside "
        "torch.distributed.tensor.experimental.context_parallel. torch's context parallel only supports SDPA "
        "without an attention mask or bias (causal attention via is_causal=True): it shards q/k/v along the "
        "sequence and has no rule to shard a mask, so without this check torch fails later with an error that does "
        'not mention the mask (e.g. "Sharding dim 2 greater than tensor ndim 2" or, on GPU, "attn_bias is not '
        'supported yet"). What you can do: turn context parallel off (CP size 1); or use a model whose attention '
        "is plain causal SDPA (transformers passes no mask when the batch has no padding and no sliding window "
        "applies) and feed unpadded sequences; note that Gemma-3's sliding-window layers always pass a mask once "
        "the sequence is longer than the window, so Gemma-3 cannot run under CP. "
        f"To skip this check: NRL_SHIM_DISABLE={ID}."
    )


def _install_guard():
    """After torch installed CP's SDPA: wrap it; the returned undo runs before torch restores its own."""
    import torch.nn.functional as F

    from nrl_shim.patching import unwrap, wrap

    wrap(F, _SDPA, _sdpa_guard, ID)
    return lambda: unwrap(F, _SDPA, ID)


# Defined after the hooks it names.
TARGETS = cp_targets(ID, after=_install_guard)


def describe(settings, version):
    return f"torch {version}: SDPA with attn_mask inside context_parallel -> clear error instead of a DTensor failure"
