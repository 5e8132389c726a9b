"""The three refit fixes that wrap a model's own `load_weights` (vllm-refit-guard, vllm-prefix-cache-refit,
vllm-layerwise-refit), taken off in every order: `python refit_fixes_unwrap_order.py DIR` (the shim on: NRL_SHIM=1).
Prints one JSON line: {"runs": [per order]}.

A tiny Qwen3-MoE checkpoint (written into DIR) is loaded with dummy weights through vLLM's own loader on the CPU build
(vllm_model_objects.py, no engine): the refit guard watches the dummy load, the prefix-cache fix every load, and the
layerwise fix a model whose MoE experts vLLM re-laid out after loading. Per order: a fresh model, a refit through its
`load_weights` as RL frameworks make it (no generation step after it: the refit guard would have checked and removed
itself), then each fix's unpatch in that order (what deactivate() calls, in its own order); after each step, which
fixes' layers are still on. Then the four are patched again for the next order.
"""

import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

IDS = ("vllm-layerwise-refit", "vllm-prefix-cache-refit", "vllm-refit-guard", "vllm-weights-probe")


def main(directory):
    import torch
    from vllm.model_executor.model_loader import get_model_loader
    from vllm_model_objects import _cpu_runner_setup, _init_distributed, engine_config, use_cpu_platform

    import nrl_shim
    from nrl_shim import activation, registry
    from nrl_shim.patching import is_instance_wrapped

    from tiny_models import state_dict_items, write_model

    use_cpu_platform()
    model_dir = write_model(os.path.join(directory, "qwen3_moe"), "qwen3_moe")
    from vllm.config import set_current_vllm_config

    vllm_config = engine_config(model_dir, "dummy")
    context = set_current_vllm_config(vllm_config)
    context.__enter__()  # for the life of this process (held by `context`: closed when collected)
    _cpu_runner_setup()
    _init_distributed()
    loader = get_model_loader(vllm_config.load_config)

    def on(model):
        return [quirk_id for quirk_id in IDS if is_instance_wrapped(model, "load_weights", quirk_id)]

    nrl_shim.activate()
    settings = activation.active_settings()
    # Where the four are patched; the dummy loader last, as at its first import: its load_model layer (a method
    # it inherits) sits over BaseModelLoader's layers, so those must be there first when they are put back.
    patched = sorted(
        ((quirk_id, name) for quirk_id, name in activation.patched() if quirk_id in IDS),
        key=lambda pair: pair[1].endswith(".dummy_loader"),
    )
    runs = []
    for order in itertools.permutations(IDS):
        # One model per order in this one config: its attention layers register by name there, so forget the last's.
        vllm_config.compilation_config.static_forward_context.clear()
        model = loader.load_model(vllm_config=vllm_config, model_config=vllm_config.model_config)
        loaded = on(model)
        with torch.no_grad():
            model.load_weights(state_dict_items(model_dir))
        after_refit, hooks = on(model), len(model._forward_pre_hooks)  # each fix's check armed for the next step
        steps = []
        for quirk_id in order:  # what deactivate() does, in this order
            for patched_id, module_name in patched:
                if patched_id == quirk_id:
                    registry.get(quirk_id).unpatch(sys.modules[module_name])
            steps.append(on(model))
        runs.append(
            {
                "order": list(order),
                "loaded": loaded,
                "after_refit": after_refit,
                "hooks_after_refit": hooks,
                "steps": steps,
                "own_attribute": "load_weights" in vars(model),
                "class_method": getattr(model.load_weights, "__func__", None) is type(model).load_weights,
                "hooks": len(model._forward_pre_hooks),
            }
        )
        for quirk_id, module_name in patched:  # on again for the next order
            registry.get(quirk_id).patch(sys.modules[module_name], settings)
    print(json.dumps({"runs": runs}))


if __name__ == "__main__":
    main(sys.argv[1])
