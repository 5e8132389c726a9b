"""One rank of the cp-attention-mask scenario (started by cp_helpers.run_ranks): SDPA with and without an attn_mask
inside and outside a real context_parallel context, in each phase of CP_TEST_PHASES, then after deactivate()."""

# isort: off
import nrl_shim
from cp_helpers import context_parallel, cp_wrapped, finish, init, outcome, phases, sdpa_is_torchs
import torch
import torch.nn.functional as F
import torch.distributed.tensor.experimental as experimental  # noqa: F401

# isort: on

rank, ws, mesh = init()
torch.manual_seed(0)
S = 16


def inside_cp(fn):
    ids = torch.arange(S).view(1, S)
    with context_parallel(mesh, ids):
        q = torch.randn(1, 4, S // ws, 8)
        return fn(q)


def outside_with_mask():
    q = torch.randn(1, 4, S, 8)
    mask = torch.ones(S, S, dtype=torch.bool).tril()
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    return torch.equal(out, torch._C._nn.scaled_dot_product_attention(q, q, q, attn_mask=mask))


def buffers_restored():
    ids = torch.arange(S).view(1, S)
    try:
        with context_parallel(mesh, ids):
            F.scaled_dot_product_attention(*[torch.randn(1, 4, S // ws, 8)] * 3, attn_mask=torch.ones(S, S).bool())
    except Exception:
        pass
    return torch.equal(ids, torch.arange(S).view(1, S))


def cases():
    guarded = nrl_shim.active_settings().is_enabled("cp-attention-mask")
    return {
        "mask_2d": outcome(
            lambda: inside_cp(
                lambda q: F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(S, S, dtype=torch.bool))
            )
        ),
        # Unguarded, torch may run these through DTensor's CPU fallback, which takes minutes: guarded phase only.
        **(
            {}
            if not guarded
            else {
                "mask_4d_kw": outcome(
                    lambda: inside_cp(
                        lambda q: F.scaled_dot_product_attention(
                            q, q, q, attn_mask=torch.ones(1, 1, S, S, dtype=torch.bool).tril()
                        )
                    )
                ),
                "mask_positional": outcome(
                    lambda: inside_cp(
                        lambda q: F.scaled_dot_product_attention(q, q, q, torch.zeros(1, 1, S // ws, S // ws))
                    )
                ),
            }
        ),
        "no_mask": outcome(lambda: inside_cp(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True))),
        "outside": outcome(outside_with_mask),
        "buffers_restored": outcome(buffers_restored),
        "sdpa_restored": sdpa_is_torchs(),
        "cp_wrapped": cp_wrapped(),
    }


results = phases(cases)
nrl_shim.deactivate()
results["after_deactivate"] = {
    "sdpa_restored": sdpa_is_torchs(),
    "cp_wrapped": cp_wrapped(),
}
finish(results)
