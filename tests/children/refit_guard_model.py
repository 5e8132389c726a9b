"""vllm-refit-guard on vLLM's real model objects, where no engine can run (vLLM < 0.11 here): `python
refit_guard_model.py MODEL_DIR`. Builds vLLM's Gemma3ForCausalLM through vLLM's own dummy loader
(vllm_model_objects.py, next to this file), refits it with its own `load_weights` as RL frameworks do, then starts a generation
step the way `nn.Module.__call__` starts one: by running the forward pre-hooks. The forward itself needs attention
kernels this machine cannot load (vllm._C needs a newer libstdc++), so it is not run. Prints one JSON line.
"""

import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(model_dir):
    from log_records import Records
    from vllm_model_objects import build_model, refit

    records = Records()
    logging.getLogger("nrl_shim").addHandler(records)
    model, vllm_config = build_model(model_dir, "dummy")
    load_format = vllm_config.load_config.load_format
    guarded = hasattr(model, "_nrl_shim_refit_guard")
    refit(model, model_dir)
    error = None
    try:
        for _ in range(2):  # two generation steps: reported once
            for hook in list(model._forward_pre_hooks.values()):
                hook(model, ())
    except Exception as exc:  # strict mode
        error = f"{type(exc).__name__}: {exc}"
    print(
        json.dumps(
            {
                "load_format": str(getattr(load_format, "value", load_format)),
                "guarded": guarded,
                # The guard's own: on 0.8.5 - 0.10.0 other fixes name once that they can't reach the release.
                "warnings": [
                    m
                    for level, m in records.messages
                    if level in ("WARNING", "ERROR") and m.startswith("[vllm-refit-guard]")
                ],
                "error": error,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
