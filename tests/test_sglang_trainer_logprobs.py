"""sglang-trainer-logprobs on a real SGLang HTTP server (tests/sglang_runs.py, the runs the other SGLang fixes' tests
share; NRL_SHIM_LOGPROBS=truncated in both, as NeMo RL HEAD's trainer is): NeMo RL's request (native /generate,
input_ids, temperature 0.7 and its training-time top-p 0.8, return_logprob). The reference is transformers' logits of
the sampled sequence, divided by T and filtered by NeMo RL HEAD's own `apply_top_k_top_p`
(nemo_rl/algorithms/logits_sampling_utils.py from ../shared/nemo-rl/7ea279abf, or NRL_SHIM_NEMO_RL_7EA279ABF):
without the shim SGLang's logprobs are the full-vocabulary ones (off NeMo RL's by the log of the kept mass); with it,
NeMo RL's."""

import importlib.util
import json
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


def _references(result, prompt=SAMPLED_PROMPT, sampling=SAMPLING, weights=SAMPLED_WEIGHTS):
    """(full-vocabulary, NeMo RL's) logprob of each sampled token, from transformers' logits of the sequence."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoints()[weights], dtype=torch.float32).eval()
    ids = prompt + result["tokens"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, len(prompt) - 1 : -1] / sampling["temperature"]
    full = torch.log_softmax(logits, dim=-1)
    filtered, _mask = _nemo_rl_filter()(logits, sampling.get("top_k"), sampling.get("top_p", 1.0))
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
@pytest.mark.parametrize(("top_k", "top_p"), [(None, 0.8), (20, None), (20, 0.8), (2, None), (None, 0.05)])
def test_renormalised_is_nemo_rls_filter(top_k, top_p):
    """The fix's renormalisation against NeMo RL HEAD's own apply_top_k_top_p on random logits, for the sampled
    token's and the top logprobs alike (the whole row): top-k only, top-p only, both, two tokens kept, one kept."""
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


def test_greedy_rows_of_a_mixed_batch_as_sglang_has_them():
    """In a batch with sampled rows SGLang samples a greedy request as temperature 1, top-k 1 (its SamplingParams):
    those rows keep SGLang's logprobs, as the same request gets alone (an all-greedy batch), not 0.0; sampled rows
    (top-k 20) are renormalised in the same batch."""
    from types import SimpleNamespace

    import torch

    from nrl_shim.quirks.sglang.trainer_logprobs import renormalised

    torch.manual_seed(0)
    vocab = 512
    full = torch.log_softmax(torch.randn(2, vocab) * 3, dim=-1)
    info = SimpleNamespace(
        is_all_greedy=False,
        need_top_k_sampling=True,
        need_top_p_sampling=False,
        top_ks=torch.tensor([1, 20]),  # the greedy request's row, then a sampled one
        top_ps=torch.ones(2),
        temperatures=torch.tensor([[1.0], [0.7]]),
    )
    got = renormalised(full.clone(), info)
    assert torch.equal(got[0], full[0])
    assert not torch.equal(got[1], full[1])


# NeMo RL HEAD's own launch route with nothing set (NRL_SHIM_LOGPROBS=auto, its default): the launching process is a
# NeMo RL process (its package imported, as in its Ray actor), launch_server runs in a spawn child, which never imports
# NeMo RL (sglang_worker.py). One server (weights A): NeMo RL's sampled request; then a greedy request alone and the
# same greedy request in one batch with a top-p and a top-k request.
GREEDY_PROMPT = [497] + [(i * 17) % 500 + 3 for i in range(29)]
TOP_P = {"temperature": 0.7, "top_p": 0.8}
TOP_K = {"temperature": 0.7, "top_k": 20}
MIXED = [
    {"prompt": GREEDY_PROMPT, "max_tokens": 16, "sampling": {"temperature": 0.0}},
    {"prompt": [496] + SAMPLED_PROMPT[1:], "max_tokens": 32, "sampling": TOP_P},
    {"prompt": [495] + SAMPLED_PROMPT[1:], "max_tokens": 32, "sampling": TOP_K},
]
DEFAULT_ROUTE = (
    ("sampled_top_p", {"kind": "sample", "prompt": SAMPLED_PROMPT, "max_tokens": 16, "sampling": SAMPLING}),
    ("greedy_alone", {"kind": "generate", "prompt": GREEDY_PROMPT, "max_tokens": 16}),
    ("mixed_batch", {"kind": "batch", "requests": MIXED}),
)


@pytest.fixture(scope="module")
def default_route():
    return server_run(
        True, launch="spawn", env=(("NRL_SHIM_LOGPROBS", None),), nemo_rl=SOURCE, order=json.dumps(DEFAULT_ROUTE)
    )


@pytest.mark.skipif(SOURCE is None, reason=str(MISSING_SOURCE))
def test_nemo_rl_launch_route_with_the_default_setting(default_route):
    assert default_route["died"] is None, default_route["log_tail"]
    result = default_route["results"]["sampled_top_p"]
    full, truncated = _references(result, weights="A")
    assert _gap(result["logprobs"], truncated) < 1e-4, (result["logprobs"], truncated)  # without the hand-off: 0.22
    assert _gap(truncated, full) > 0.05  # the two differ here: the gap the fix closes
    changed = [line for line in default_route["shim_lines"] if f"[{ID}]" in line]
    assert len(changed) == 1 and "NeMo RL" in changed[0], default_route["shim_lines"]


@pytest.mark.skipif(SOURCE is None, reason=str(MISSING_SOURCE))
def test_logprobs_do_not_depend_on_the_batch(default_route):
    results = default_route["results"]
    alone = results["greedy_alone"]
    greedy, top_p, top_k = results["mixed_batch"]["results"]
    assert greedy["tokens"] == alone["tokens"], (greedy, alone)
    assert _gap(greedy["logprobs"], alone["logprobs"]) < 1e-4, (greedy["logprobs"], alone["logprobs"])  # not 0.0
    assert max(abs(v) for v in greedy["logprobs"]) > 0.01, greedy["logprobs"]
    for row, request in ((top_p, MIXED[1]), (top_k, MIXED[2])):
        full, truncated = _references(row, prompt=request["prompt"], sampling=request["sampling"], weights="A")
        # a batch of three on the CPU: ~1e-4 of float noise; the renormalisation itself is > 0.05 here
        assert _gap(row["logprobs"], truncated) < 1e-3, (request["sampling"], row["logprobs"], truncated)
        assert _gap(full, truncated) > 0.05, request["sampling"]


@pytest.mark.full
@pytest.mark.skipif(SOURCE is None, reason=str(MISSING_SOURCE))
def test_original_logprobs_left_as_asked():
    """SGLANG_RETURN_ORIGINAL_LOGPROB=1 asks SGLang for the logprobs of the unscaled logits: left as they are under
    NRL_SHIM_LOGPROBS=truncated (renormalised, they would be off by the kept mass)."""
    import torch
    from transformers import AutoModelForCausalLM

    order = json.dumps(DEFAULT_ROUTE[:1])
    run = server_run(True, launch="spawn", env=(("SGLANG_RETURN_ORIGINAL_LOGPROB", "1"),), order=order)
    assert run["died"] is None, run["log_tail"]
    result = run["results"]["sampled_top_p"]
    model = AutoModelForCausalLM.from_pretrained(checkpoints()["A"], dtype=torch.float32).eval()
    ids = SAMPLED_PROMPT + result["tokens"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, len(SAMPLED_PROMPT) - 1 : -1]
    original = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(result["tokens"]).unsqueeze(-1))
    assert _gap(result["logprobs"], original.squeeze(-1).tolist()) < 1e-4, result["logprobs"]
    assert not [line for line in run["shim_lines"] if f"[{ID}]" in line and "renormalised" in line], run["shim_lines"]


@pytest.mark.full
@pytest.mark.skipif(SOURCE is None, reason=str(MISSING_SOURCE))
def test_nemo_rl_process_starting_the_server_command_with_the_default_setting():
    """`python -m sglang.launch_server` started by a NeMo RL process (its package imported, SGLang's engine not): the
    command's processes never import NeMo RL and get the renormalised logprobs with nothing set."""
    order = json.dumps(DEFAULT_ROUTE[:1])
    run = server_run(True, launch="cli", env=(("NRL_SHIM_LOGPROBS", None),), nemo_rl=SOURCE, order=order)
    assert run["died"] is None, run["log_tail"]
    result = run["results"]["sampled_top_p"]
    _full, truncated = _references(result, weights="A")
    assert _gap(result["logprobs"], truncated) < 1e-4, (result["logprobs"], truncated)
