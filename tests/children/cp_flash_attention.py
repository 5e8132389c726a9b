"""One rank of the cp-flash-attention scenario (started by cp_helpers.run_ranks): transformers' flash-attention entry
and a model forward dispatched to it, inside and outside a real context_parallel context, in each phase of
CP_TEST_PHASES."""

# isort: off
import nrl_shim  # noqa: F401
from cp_helpers import context_parallel, finish, init, outcome, phases, sdpa_is_torchs, tiny_llama
import torch
import transformers.integrations.flash_attention as integration
import transformers.modeling_flash_attention_utils as utils
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

# isort: on

rank, ws, mesh = init()
llama = tiny_llama()
attention = llama.model.layers[0].self_attn
S = 16


def dispatch(cp=True):
    q = torch.randn(1, 4, S // ws, 8)
    kv = torch.randn(1, 2, S // ws, 8)

    def call():
        return ALL_ATTENTION_FUNCTIONS["flash_attention_2"](attention, q, kv, kv, None, dropout=0.0, scaling=0.35)

    if not cp:
        return call()[0]
    ids = torch.arange(S).view(1, S)
    with context_parallel(mesh, ids):
        return call()[0]


def model_forward():
    # The model's own dispatch: its attention layers look up config._attn_implementation at each forward.
    llama.config._attn_implementation = "flash_attention_2"
    ids = torch.arange(S).view(1, S)
    try:
        with context_parallel(mesh, ids):
            return llama(input_ids=ids).logits
    finally:
        llama.config._attn_implementation = "sdpa"


def cases():
    results = {
        "dispatch": outcome(dispatch),
        "outside": outcome(lambda: dispatch(cp=False)),
        "model_forward": outcome(model_forward),
        "binding_synced": integration._flash_attention_forward is utils._flash_attention_forward,
        "sdpa_restored": sdpa_is_torchs(),
    }
    return results


finish(phases(cases))
