"""One rank of the cp-sequence-parallel scenario (started by cp_helpers.run_ranks): tensor and sequence parallel
applied with parallelize_module before and inside a real context_parallel context, in each phase of CP_TEST_PHASES."""

# isort: off
import gc
import nrl_shim  # noqa: F401
from cp_helpers import context_parallel, finish, init, outcome, phases, sdpa_is_torchs
import torch
from torch import nn
import torch.distributed.tensor.parallel as tp
from torch.distributed.tensor.parallel import ColwiseParallel, SequenceParallel

# isort: on


def parallelize_module(*a):
    return tp.parallelize_module(*a)  # looked up at each call: the shim is re-activated between phases


rank, ws, mesh = init()
S = 16


def sharded_inside_cp(fn=lambda: None):
    ids = torch.arange(S).view(1, S)
    seen = []
    try:
        with context_parallel(mesh, ids):
            seen.append(list(ids.shape))
            fn()
    finally:
        seen.append(torch.equal(ids, torch.arange(S).view(1, S)))  # buffers restored (or never sharded)
    return seen


def cases():
    results = {}
    block = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    results["tp_only_then_cp"] = outcome(
        lambda: (parallelize_module(block, mesh, {"0": ColwiseParallel()}), sharded_inside_cp())[1]  # noqa: F821
    )
    parallelize_module(block, mesh, {"1": SequenceParallel()})
    results["sp_then_cp"] = outcome(sharded_inside_cp)
    del block
    gc.collect()
    results["sp_module_gone_then_cp"] = outcome(sharded_inside_cp)
    results["cp_then_sp"] = outcome(
        lambda: sharded_inside_cp(lambda: parallelize_module(nn.LayerNorm(8), mesh, SequenceParallel()))
    )
    results["sdpa_restored"] = sdpa_is_torchs()
    gc.collect()
    return results


finish(phases(cases))
