"""vllm-eagle3-own-lm-head: an Eagle3 draft with a truncated vocabulary (draft_vocab_size != vocab_size) must keep
its own LM head. On vLLM's real Eagle3LlamaForCausalLM and target LlamaForCausalLM (dummy weights, as RL loads them;
tests/children/vllm_eagle3_lm_head.py), through vLLM's two sharing rules — the GPU model runner's load_eagle_model
(`_should_share(eagle, "has_own_lm_head", ...)`) and EagleProposer._maybe_share_lm_head — without the shim the
draft's head is replaced by the target's (512 rows for 128 draft tokens) and a refit of the draft's head fails; with
it the draft keeps its own 128-row head and the refit lands in it."""

from vllm_object_tests import requires, run_children, shim_lines

from nrl_shim.quirks.vllm.models import eagle3_own_lm_head as quirk

PATHS = ("gpu_runner_load_eagle_model", "proposer_maybe_share_lm_head")


@requires(quirk.VERSIONS)
def test_eagle3_truncated_vocabulary_keeps_its_head(tmp_path):
    runs = run_children(
        "vllm_eagle3_lm_head",
        {
            "off": ([str(tmp_path / "off")], {"NRL_SHIM": "0"}),
            "on": ([str(tmp_path / "on")], {"NRL_SHIM": "1"}),
        },
    )
    (off, off_err), (on, on_err) = runs["off"], runs["on"]
    assert off["draft_class"] == on["draft_class"] == "Eagle3LlamaForCausalLM"
    draft, vocab = off["draft_vocab"], off["vocab"]
    assert draft < vocab
    for path in PATHS:
        bug, fixed = off[path], on[path]
        # Without the shim: the flag unset, the draft's head replaced by the target's.
        assert not bug["has_own_lm_head"], (path, bug)
        assert bug["shares_target_lm_head"] and bug["lm_head_rows"] == vocab, (path, bug)
        # With it: its own head, draft_vocab_size rows; draft logits still scattered to the full vocabulary.
        assert fixed["has_own_lm_head"] is True and not fixed["shares_target_lm_head"], (path, fixed)
        assert fixed["lm_head_rows"] == draft and fixed["logits"] == [1, vocab], (path, fixed)
    # An online-trained draft's refit of its head: refused (shape) into the target's head without the shim; loaded
    # into the draft's own with it; the target's head untouched either way.
    bug, fixed = off["gpu_runner_load_eagle_model"], on["gpu_runner_load_eagle_model"]
    assert bug["refit_lm_head"] != "loaded"
    assert fixed["refit_lm_head"] == "loaded" and fixed["refit_lm_head_in_draft"]
    assert not bug["target_lm_head_changed"] and not fixed["target_lm_head_changed"]

    assert shim_lines(off_err, quirk.ID) == []
    lines = shim_lines(on_err, quirk.ID)
    # One line per process for the same change (two drafts are built: one per sharing path).
    assert len(lines) == 1, lines
    assert f"has_own_lm_head (draft vocabulary {draft} of {vocab}): False -> True" in lines[0]
    assert quirk.LINK in lines[0]
