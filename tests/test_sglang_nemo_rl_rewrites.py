"""sglang-nemo-rl-rewrites with NeMo RL HEAD's own code (nemo_rl/models/generation/sglang/utils/patches.py and
nemo_rl/models/policy/utils.py from ../shared/nemo-rl/7ea279abf, or NRL_SHIM_NEMO_RL_7EA279ABF) on real SGLang
0.5.12.post1, NeMo RL HEAD's pin (`nox -s sglang_nemo_rl`), and 0.5.10.post1 (`nox -s sglang_areal`, the same results;
NeMo RL HEAD does not import beside 0.5.23's transformers 5.19: its own check wants < 5.12, so on `nox -s sglang`
these tests skip, saying so).

- NeMo RL's worker-start rewrites (`_apply_sglang_compat_patches`): without the shim they write into SGLang's files
  (shown on a copy of the two files, never on the venv); under the shim nothing under the venv's site-packages changes
  (every file hashed before and after) and the shim names each rewrite it took over.
- NeMo RL's refit of a real SGLang server (`stream_weights_via_http_impl`: flattened buckets of NeMo RL's classes,
  then its flush): without the shim (and without NeMo RL's rewrite) SGLang's unpickler refuses NeMo RL's metadata
  class, the scheduler dies of it and the server with it (0.5.12.post1, 0.5.10.post1); under the shim the weights
  land: the prompt is served as transformers serves it with the new weights.
- sglang#27948's backport: the release's real `CustomAllReduceV2.capture()` with SGLANG_MEMORY_SAVER_CUDA_GRAPH on
  sets the kernel's capture flag without the shim, leaves it off under it (the kernel object is a stand-in: it needs
  a GPU; tests/children/sglang_nemo_rl_rewrites.py).
Two server starts (~1-5 min each here).
"""

import importlib.metadata
import os
import shutil
import sys

import pytest
from nemo_rl_helpers import nemo_rl_source

from conftest import SOURCE_ROOT, child_path, run_case
from sglang_helpers import HARNESS, REAL_SGLANG, SGLANG_VERSION, logprob_gap, sglang_env
from sglang_runs import MAX_TOKENS, PROMPT, _server_args, checkpoints, references
from site_packages_hash import differences, site_packages, snapshot

COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
SOURCE, MISSING_SOURCE = nemo_rl_source(
    COMMIT, "NRL_SHIM_NEMO_RL_7EA279ABF", "nemo_rl/models/generation/sglang/utils/patches.py"
)


def _transformers_too_new():
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None
    from packaging.version import Version

    if Version(version) >= Version("5.12"):
        return f"NeMo RL HEAD imports only beside transformers < 5.12 (its own check); this venv has {version}"
    return None


TOO_NEW = _transformers_too_new() if SGLANG_VERSION else None
pytestmark = [
    *REAL_SGLANG,
    pytest.mark.skipif(SOURCE is None, reason=MISSING_SOURCE or ""),
    pytest.mark.skipif(TOO_NEW is not None, reason=TOO_NEW or ""),
]
FIX = "[sglang-nemo-rl-rewrites]"
REWRITTEN = ("srt/utils/common.py", "srt/distributed/device_communicators/custom_all_reduce_v2.py")  # NeMo RL's two


def env(shim, extra=None):
    return sglang_env(
        {
            "PYTHONPATH": os.pathsep.join([HARNESS, SOURCE_ROOT, SOURCE or ""]),
            "NRL_SHIM": "1" if shim else "0",
            "NRL_SHIM_LOG_LEVEL": "INFO",
            **(extra or {}),
        }
    )


def sglang_copy(root):
    """The installed SGLang's two files NeMo RL rewrites, copied under `root`/sglang (with an empty __init__.py)."""
    import importlib.util

    installed = next(iter(importlib.util.find_spec("sglang").submodule_search_locations))
    for name in REWRITTEN:
        target = root / "sglang" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.join(installed, name), target)
    (root / "sglang" / "__init__.py").write_text("")
    return str(root)


def run_child(tmp_path, run, shim, extra_env=None):
    """tests/children/sglang_nemo_rl_rewrites.py with `run`, the shim on or off: its JSON output."""
    out, _ = run_case(child_path("sglang_nemo_rl_rewrites"), run, tmp_path, env=env(shim, extra_env), timeout=300)
    return out


def test_nemo_rl_rewrites_land_in_sglang_files_without_the_shim(tmp_path):
    copy = sglang_copy(tmp_path / "copy")
    out = run_child(tmp_path, {"mode": "rewrites", "sglang_root": copy, "shim": False}, shim=False)
    assert out["root"].startswith(copy), out
    assert out["error"] is None, out
    changed = [name for name in out["before"] if out["before"][name] != out["after"][name]]
    assert changed == list(out["before"]), out  # both files rewritten on 0.5.12.post1


def test_nemo_rl_rewrites_write_nothing_under_the_shim(tmp_path):
    before = snapshot(sys.executable)
    out = run_child(tmp_path, {"mode": "rewrites", "sglang_root": None, "shim": True}, shim=True)
    assert out["shim_active"] and out["wrapped"], out
    assert out["error"] is None, out
    assert out["before"] == out["after"], out
    assert differences(before, snapshot(sys.executable)) == [], site_packages(sys.executable)
    lines = [line for line in out["shim_lines"] if line.startswith(FIX)]
    assert any("utils/common.py" in line and "not written" in line for line in lines), out["shim_lines"]
    assert any("custom_all_reduce_v2.py" in line and "in memory" in line for line in lines), out["shim_lines"]


@pytest.mark.parametrize("shim", [False, True], ids=["no-shim", "shim"])
def test_all_reduce_capture_flag_off_with_torch_memory_saver_graphs(tmp_path, shim):
    out = run_child(tmp_path, {"mode": "capture"}, shim, {"SGLANG_MEMORY_SAVER_CUDA_GRAPH": "1"})
    assert out["inside"] == ([False] if shim else [True]), out  # the flag while the graph is captured
    assert out["flags"] == out["inside"] + [False], out
    if shim:
        assert any(line.startswith(FIX) and "capture flag" in line for line in out["shim_lines"]), out


@pytest.fixture(scope="module")
def refits(tmp_path_factory):
    """NeMo RL's refit to checkpoint B of a server holding A, then the prompt: without and with the shim."""
    paths = checkpoints()
    cases = [
        {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS},
        {"kind": "nemo_rl_update", "model_path": paths["B"]},
        {"kind": "generate", "prompt": PROMPT, "max_tokens": MAX_TOKENS},
    ]
    out = {}
    for shim in (False, True):
        root = tmp_path_factory.mktemp(f"nemo-rl-refit-{'shim' if shim else 'plain'}")
        out[shim], _ = run_case(
            child_path("sglang_server"),
            {"model_path": paths["A"], "args": _server_args(), "cases": cases},
            root,
            env=env(shim),
            timeout=1800,
            name="nemo_rl_refit",
        )
        print(f"NeMo RL refit ({'shim' if shim else 'no shim'}): {out[shim]['cases']}", file=sys.stderr)
    return out


def test_nemo_rl_refit_fails_without_the_shim_and_lands_with_it(refits):
    plain = [case["result"] for case in refits[False]["cases"]]
    assert plain[0]["tokens"] == references()["A"]["tokens"], plain
    # SGLang's unpickler refuses NeMo RL's class in the scheduler, which 0.5.12.post1 does not survive: the server
    # goes down and NeMo RL's POST gets no answer.
    assert plain[1]["ok"] is False, plain[1]
    blocked = (
        "Blocked unsafe class loading (nemo_rl.models.generation.sglang.utils.train_utils.FlattenedTensorMetadata)"
    )
    assert refits[False]["died"] is not None and blocked in refits[False]["log_tail"], refits[False]["log_tail"]

    shim = [case["result"] for case in refits[True]["cases"]]
    assert refits[True]["died"] is None, refits[True]["log_tail"]
    assert shim[1] == {"ok": True}, shim[1]
    after = shim[2]
    assert after["tokens"] == references()["B"]["tokens"] and logprob_gap(after, references()["B"]) < 1e-3, after
    assert after["cached"] == 0, after  # NeMo RL's flush after the buckets (the radix fix agrees)
    assert any(FIX in line and "allowed" in line for line in refits[True]["shim_lines"]), refits[True]["shim_lines"]
