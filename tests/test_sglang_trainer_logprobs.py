"""sglang-trainer-logprobs on a real SGLang HTTP server (tests/sglang_runs.py, the runs the other SGLang fixes' tests
share; NRL_SHIM_LOGPROBS=truncated in both, as NeMo RL HEAD's trainer is): NeMo RL's request (native /generate,
input_ids, temperature 0.7 and its training-time top-p 0.8, return_logprob). The reference is transformers' logits of
the sampled sequence, divided by T and filtered by NeMo RL HEAD's own `apply_top_k_top_p`
(nemo_rl/algorithms/logits_sampling_utils.py from ../shared/nemo-rl/7ea279abf, or NRL_SHIM_NEMO_RL_7EA279ABF):
without the shim SGLang's logprobs are the full-vocabulary ones (off NeMo RL's by the log of the kept mass); with it,
NeMo RL's."""

import importlib.util
import os

import pytest
from nemo_rl_helpers import nemo_rl_source

from sglang_helpers import REAL_SGLANG
from sglang_runs import SAMPLED_PROMPT, SAMPLED_WEIGHTS, SAMPLING, checkpoints, server_run

pytestmark = REAL_SGLANG
ID = "sglang-trainer-logprobs"
COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
MODULE = "nemo_rl/algorithms/logits_sampling_utils.py"
SOURCE, MISSING_SOURCE = nemo_rl_source(COMMIT, "NRL_SHIM_NEMO_RL_7EA279ABF", MODULE)


def _nemo_rl_filter():
    # The one file, by path: NeMo RL's package __init__ imports what this venv does not have.
    spec = importlib.util.spec_from_file_location("nemo_rl_logits_sampling_utils", os.path.join(SOURCE, MODULE))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.apply_top_k_top_p


def _references(result):
    """(full-vocabulary, NeMo RL's) logprob of each sampled token, from transformers' logits of the sequence."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoints()[SAMPLED_WEIGHTS], dtype=torch.float32).eval()
    ids = SAMPLED_PROMPT + result["tokens"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, len(SAMPLED_PROMPT) - 1 : -1] / SAMPLING["temperature"]
    full = torch.log_softmax(logits, dim=-1)
    filtered, _mask = _nemo_rl_filter()(logits, None, SAMPLING["top_p"])
    truncated = torch.log_softmax(filtered, dim=-1)
    index = torch.tensor(result["tokens"]).unsqueeze(-1)
    return full.gather(-1, index).squeeze(-1).tolist(), truncated.gather(-1, index).squeeze(-1).tolist()


def _gap(got, want):
    return max(abs(a - b) for a, b in zip(got, want))


@pytest.mark.skipif(SOURCE is None, reason=str(MISSING_SOURCE))
def test_full_vocabulary_logprobs_without_the_shim():
    result = server_run(False)["results"]["sampled_top_p"]
    full, truncated = _references(result)
    assert _gap(result["logprobs"], full) < 1e-4
    assert _gap(result["logprobs"], truncated) > 0.05  # the mismatch NeMo RL's trainer sees


@pytest.mark.skipif(SOURCE is None, reason=str(MISSING_SOURCE))
def test_nemo_rl_trainer_logprobs_under_the_shim():
    run = server_run(True)
    result = run["results"]["sampled_top_p"]
    _full, truncated = _references(result)
    assert _gap(result["logprobs"], truncated) < 1e-4, (result["logprobs"], truncated)
    changed = [line for line in run["shim_lines"] if f"[{ID}]" in line]
    assert len(changed) == 1 and "renormalised" in changed[0], run["shim_lines"]


@pytest.mark.skipif(SOURCE is None, reason=str(MISSING_SOURCE))
@pytest.mark.parametrize(("top_k", "top_p"), [(None, 0.8), (20, None), (20, 0.8), (1, None), (None, 0.05)])
def test_renormalised_is_nemo_rls_filter(top_k, top_p):
    """The fix's renormalisation against NeMo RL HEAD's own apply_top_k_top_p on random logits, for the sampled
    token's and the top logprobs alike (the whole row): top-k only, top-p only, both, a single token kept."""
    from types import SimpleNamespace

    import torch

    from nrl_shim.quirks.sglang.trainer_logprobs import renormalised

    torch.manual_seed(0)
    rows, vocab, temperature = 4, 512, 0.7
    logits = torch.randn(rows, vocab) * 3 / temperature
    full = torch.log_softmax(logits, dim=-1)
    info = SimpleNamespace(
        is_all_greedy=False,
        need_top_k_sampling=top_k is not None,
        need_top_p_sampling=top_p is not None,
        top_ks=torch.full((rows,), top_k if top_k is not None else 1 << 30),
        top_ps=torch.full((rows,), top_p if top_p is not None else 1.0),
        temperatures=torch.full((rows, 1), temperature),
    )
    got = renormalised(full.clone(), info)
    filtered, _mask = _nemo_rl_filter()(logits, top_k, top_p if top_p is not None else 1.0)
    want = torch.log_softmax(filtered, dim=-1).clamp(min=torch.finfo(torch.float32).min)
    kept = torch.isfinite(torch.log_softmax(filtered, dim=-1))
    assert torch.equal(kept, got > torch.finfo(torch.float32).min)  # the same tokens kept
    assert torch.allclose(got[kept], want[kept], atol=1e-5)
    assert (got[kept] - full[kept]).abs().max() > 1e-3 or bool(kept.all())  # renormalised, not SGLang's own
