"""sglang-sampling-defaults on a real SGLang HTTP server (tests/sglang_runs.py, the runs the radix fix's tests share):
the checkpoint's generation_config.json says `top_k: 1`; a GRPO group of 8 chat completions at temperature 1.0 with
top_k/top_p left unset comes out as one completion without the shim (SGLang fills them from the checkpoint), as 8
with it; a request's own `top_k: 1` is kept either way; `--sampling-defaults model` on the command line is kept
(`nox -t full`)."""

import pytest

from sglang_helpers import REAL_SGLANG
from sglang_runs import CHAT_CASES, GROUP, server_run

pytestmark = REAL_SGLANG
ID = "sglang-sampling-defaults"


def _distinct(run, case):
    texts = run["results"][case]["texts"]
    assert len(texts) == GROUP and all(isinstance(text, str) for text in texts), texts
    return len(set(texts))


def test_checkpoint_defaults_collapse_the_group_without_the_shim():
    plain = server_run(False)
    assert _distinct(plain, "chat_unset") == 1
    assert _distinct(plain, "chat_request_top_k") == 1


def test_group_samples_under_the_shim():
    shim = server_run(True)
    assert _distinct(shim, "chat_unset") > GROUP // 2
    assert _distinct(shim, "chat_request_top_k") == 1  # the request's own top_k kept
    changed = [line for line in shim["shim_lines"] if f"[{ID}]" in line]
    assert len(changed) == 1 and "'top_k': 1" in changed[0] and "-> {}" in changed[0], shim["shim_lines"]


@pytest.mark.full
def test_explicit_sampling_defaults_model_kept():
    explicit = server_run(True, ("--sampling-defaults", "model"), tuple(name for name, _case in CHAT_CASES))
    assert _distinct(explicit, "chat_unset") == 1
    kept = [line for line in explicit["shim_lines"] if f"[{ID}]" in line]
    assert kept and all("nothing to change" in line for line in kept), explicit["shim_lines"]
