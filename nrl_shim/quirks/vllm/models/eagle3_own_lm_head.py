"""Eagle3 draft with a truncated vocabulary: its own LM head must not be replaced by the target's.

An Eagle3 draft (vLLM's Eagle3LlamaForCausalLM, `vllm/model_executor/models/llama_eagle3.py`) may predict over a
smaller vocabulary than its target (`draft_vocab_size` < `vocab_size`, mapped back through `d2t`); its `lm_head` then
has draft_vocab_size rows and cannot be the target's. vLLM decides whether the draft shares the target's LM head from
the model's `has_own_lm_head` flag: the GPU model runner's `load_eagle_model` (`_should_share(eagle_model,
"has_own_lm_head", ...)`, v1/worker/gpu/spec_decode/eagle/utils.py) and the proposers' `_maybe_share_lm_head`
(v1/spec_decode/eagle.py, later llm_base_proposer.py) replace the draft's `lm_head` with the target's when the flag is
false. Eagle3LlamaForCausalLM never sets it: only `process_eagle_weight` does, when a checkpoint weight named
`lm_head` passes through load_weights. A draft loaded with load_format="dummy" (RL: the draft is trained online and
refit, as in NeMo RL) or from a checkpoint without `lm_head` gets the target's head: draft logits over the wrong
vocabulary (compute_logits fails on the d2t scatter) and draft refits written into the target's head. Read from the
releases' source: flag-based sharing from 0.11.1 (0.11.0 shared an Eagle3 head only when the shapes matched); no
release up to 0.33.0 sets the flag for a truncated vocabulary (checked 0.11.1, 0.12.0, 0.13.0, 0.17.0, 0.20.0, 0.22.0,
0.25.1, 0.27.1, 0.29.0, 0.32.0, 0.33.0). NeMo RL HEAD (7ea279abf) rewrites llama_eagle3.py in site-packages for this
(`_patch_vllm_llama_eagle3_own_lm_head`).

The fix, in memory: after Eagle3LlamaForCausalLM.__init__, a draft whose `draft_vocab_size` differs from its
`vocab_size` gets `has_own_lm_head = True` (what NeMo RL's rewrite sets). Both sharing rules then keep its head (its
weight can't equal the target's: the shapes differ). A draft with the full vocabulary is left as vLLM builds it.
Idle ("nothing to change") when the model sets the flag itself (fixed upstream, or NeMo RL's rewrite in place).
"""

ID = "vllm-eagle3-own-lm-head"
SUMMARY = "Eagle3 drafts with a truncated vocabulary keep their own LM head (has_own_lm_head), not the target's"
LINK = "https://github.com/NVIDIA-NeMo/RL/blob/7ea279abf/nemo_rl/models/generation/vllm/patches.py"
LIBRARY = "vllm"
FIRST_AFFECTED = "0.11.1"
# The bug exists from 0.11.1 (flag-based sharing) and the fix reaches all of it: before, not affected (llama_eagle3.py
# is there from 0.8.5, 0.9.1's V1 engine imports it, but its head is shared only when the shapes match: no warning).
VERSIONS, VERIFIED = f">={FIRST_AFFECTED}", f">={FIRST_AFFECTED},<0.34"
AFFECTED = VERSIONS
NOT_AFFECTED = f"before {FIRST_AFFECTED} vLLM shares an Eagle3 draft's LM head only when the shapes match"
REQUIRES = ("vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM.__init__",)

_WHY = (
    "a truncated-vocabulary Eagle3 draft never sets has_own_lm_head unless a checkpoint `lm_head` passes through its "
    f"load_weights, so vLLM's proposer replaces its head with the target's (dummy load, online draft training); see {LINK}"
)


def patch(module, settings):
    from nrl_shim.patching import wrap

    def init_wrapper(wrapped, instance, args, kwargs):
        wrapped(*args, **kwargs)
        try:
            _own_head(instance)
        except Exception as error:  # never break building a model over this
            from nrl_shim import report

            report.logger().debug("[%s] could not check %s: %r", ID, type(instance).__name__, error)

    wrap(module.Eagle3LlamaForCausalLM, "__init__", init_wrapper, ID)


def _own_head(model):
    from nrl_shim import report

    what = f"{type(model).__name__}.has_own_lm_head"
    if "has_own_lm_head" in vars(model):
        report.unchanged(ID, what, "the model sets it itself")
        return
    config = model.config
    draft, full = getattr(config, "draft_vocab_size", None), getattr(config, "vocab_size", None)
    if draft is None or full is None or draft == full:
        return  # full vocabulary: vLLM's own rule (share when the checkpoint has no lm_head) stands
    before = getattr(model, "has_own_lm_head", None)  # the class default (False), where there is one
    model.has_own_lm_head = True
    report.changed(ID, f"{what} (draft vocabulary {draft} of {full})", before, True, _WHY)


def unpatch(module):
    from nrl_shim.patching import unwrap

    unwrap(module.Eagle3LlamaForCausalLM, "__init__", ID)


TARGETS = {"vllm.model_executor.models.llama_eagle3": (patch, unpatch)}


def describe(settings, version):
    return "Eagle3LlamaForCausalLM with draft_vocab_size != vocab_size: has_own_lm_head = True (keeps its own head)"
