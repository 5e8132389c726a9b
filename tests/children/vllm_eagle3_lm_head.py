"""vLLM's REAL Eagle3 draft (Eagle3LlamaForCausalLM) with a truncated vocabulary, built on CPU for a real target
(LlamaForCausalLM) through vLLM's own config and loaders, then put through vLLM's own LM-head sharing rules, for the
vllm-eagle3-own-lm-head tests. Prints one JSON line.

    python vllm_eagle3_lm_head.py DIR

No engine: EngineArgs(model=target, speculative_config={"method": "eagle3", ...}, load_format="dummy")
.create_engine_config() on the CPU platform, the target through vLLM's model loader, then
- `load_eagle_model(target, vllm_config)` (v1/worker/gpu/spec_decode/eagle/utils.py, the GPU model runner's path):
  builds and loads the draft, then applies `_should_share(eagle_model, "has_own_lm_head", ...)`;
- the proposer's `_maybe_share_lm_head(target)` (v1/spec_decode: EagleProposer, the other model runner's path) on a
  second draft built by vLLM's `get_model` for the same config. The method reads `self.model` (and, on recent releases, after
  deciding, `self.vllm_config` and `self.use_local_argmax_reduction`), so it is called on an EagleProposer made without its constructor (which needs a device and a
  runner) holding that draft and the config.
For each: is the draft's `lm_head` the target's, its rows, and what compute_logits gives for one hidden state (the
draft's scatter through d2t needs draft_vocab_size logits). Dummy weights: the RL case (the draft is trained online
and refit), where no checkpoint `lm_head` passes through load_weights before vLLM decides.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VOCAB = 512
DRAFT_VOCAB = 128


def write(directory):
    """config.json of the target (tiny Llama) and of its Eagle3 draft (one layer, truncated vocabulary)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for nrl_shim's configs
    from nrl_shim.explain.tiny_configs import CONFIGS

    target = dict(CONFIGS["llama"], torch_dtype="float32", vocab_size=VOCAB)
    draft = dict(
        target,
        architectures=["LlamaForCausalLMEagle3"],
        num_hidden_layers=1,
        draft_vocab_size=DRAFT_VOCAB,
    )
    for name, config in (("target", target), ("draft", draft)):
        os.makedirs(os.path.join(directory, name), exist_ok=True)
        with open(os.path.join(directory, name, "config.json"), "w") as f:
            json.dump(config, f)
    return os.path.join(directory, "target"), os.path.join(directory, "draft")


def build(target_dir, draft_dir):
    import inspect

    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm_model_objects import _cpu_runner_setup, _init_distributed, use_cpu_platform

    platform = use_cpu_platform()
    vllm_config = EngineArgs(
        model=target_dir,
        load_format="dummy",
        dtype="float32",
        skip_tokenizer_init=True,
        max_model_len=128,
        enforce_eager=True,
        speculative_config={"method": "eagle3", "model": draft_dir, "num_speculative_tokens": 1},
    ).create_engine_config()
    _CONTEXTS.append(set_current_vllm_config(vllm_config))
    _CONTEXTS[-1].__enter__()  # kept set for the life of this process: layers look it up
    _cpu_runner_setup()
    _init_distributed()
    loader = get_model_loader(vllm_config.load_config)
    if "model_config" in inspect.signature(loader.load_model).parameters:
        target = loader.load_model(vllm_config=vllm_config, model_config=vllm_config.model_config)
    else:
        target = loader.load_model(vllm_config=vllm_config)
    return platform, vllm_config, target


_CONTEXTS = []


def head_state(draft, target):
    import torch

    state = {
        "has_own_lm_head": getattr(draft, "has_own_lm_head", None),
        "shares_target_lm_head": draft.lm_head is target.lm_head,
        "lm_head_rows": int(draft.lm_head.weight.shape[0]),
    }
    hidden = torch.randn(1, draft.config.hidden_size)
    try:
        with torch.no_grad():
            logits = draft.compute_logits(hidden)
        state["logits"] = list(logits.shape)
    except Exception as error:  # what a generation step's drafting would hit
        state["logits_error"] = f"{type(error).__name__}: {str(error)[:200]}"
    return state


def refit_head(draft, target):
    """An online-trained draft's refit of its head (what NeMo RL sends after each step): a draft_vocab_size x hidden
    `lm_head.weight` through the draft's own load_weights. Did it load, and did the target's head change?"""
    import torch

    before = target.lm_head.weight.detach().clone()
    new = torch.randn(DRAFT_VOCAB, draft.config.hidden_size, generator=torch.Generator().manual_seed(2))
    state = {}
    try:
        with torch.no_grad():
            draft.load_weights([("lm_head.weight", new)])
        state["refit_lm_head"] = "loaded"
        state["refit_lm_head_in_draft"] = bool(torch.equal(draft.lm_head.weight[:DRAFT_VOCAB], new))
    except Exception as error:
        state["refit_lm_head"] = f"{type(error).__name__}: {str(error)[:200]}"
    state["target_lm_head_changed"] = not torch.equal(target.lm_head.weight, before)
    return state


def main(directory):
    target_dir, draft_dir = write(directory)
    platform, vllm_config, target = build(target_dir, draft_dir)
    import vllm
    from vllm.model_executor.model_loader import get_model

    result = {"vllm": vllm.__version__, "platform": platform, "draft_vocab": DRAFT_VOCAB, "vocab": VOCAB}
    from vllm.v1.worker.gpu.spec_decode.eagle.utils import load_eagle_model

    layers = vllm_config.compilation_config.static_forward_context
    before = set(layers)
    draft = load_eagle_model(target, vllm_config)
    for name in set(layers) - before:  # the second draft below registers the same attention layer names
        del layers[name]
    result["draft_class"] = type(draft).__name__
    result["gpu_runner_load_eagle_model"] = dict(head_state(draft, target), **refit_head(draft, target))

    from vllm.v1.spec_decode.eagle import EagleProposer  # the proposer vLLM builds for method "eagle3"

    proposer = object.__new__(EagleProposer)
    proposer.vllm_config, proposer.speculative_config = vllm_config, vllm_config.speculative_config  # as __init__ sets
    proposer.model = get_model(vllm_config=vllm_config, model_config=vllm_config.speculative_config.draft_model_config)
    proposer.use_local_argmax_reduction = False  # read after the decision on recent releases (__init__'s default)
    state = {"proposer": EagleProposer.__name__}
    try:
        proposer._maybe_share_lm_head(target)
    except AttributeError as error:  # an attribute of __init__'s read after the LM-head decision (the test checks it)
        state["after_decision"] = f"{type(error).__name__}: {error}"
    result["proposer_maybe_share_lm_head"] = dict(head_state(proposer.model, target), **state)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
