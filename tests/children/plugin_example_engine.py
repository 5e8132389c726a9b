"""The example plugin quirk (examples/quirk-plugin, vllm-use-inductor) in the driver and in vLLM's own processes:
`python plugin_example_engine.py MODEL_DIR [engine]`. Prints one JSON object.

Always: `EngineArgs(compilation_config={"use_inductor": False})` as NeMo RL's async worker would pass it without its own
translation (the error or the backend vLLM ends up with). With `engine`: an LLM given the same dict, its engine core in a
process of vLLM's own (V1 multiprocessing), asked through collective_rpc (needs VLLM_ALLOW_INSECURE_SERIALIZATION=1)
what the quirk does there.
"""

import json
import os
import sys

ENGINE_KW = dict(
    skip_tokenizer_init=True, dtype="float32", max_model_len=128, enforce_eager=True, gpu_memory_utilization=0.05
)
CONFIG = {"use_inductor": False}


def in_vllm_process(self=None):
    """Runs in vLLM's worker (the engine core process on the CPU build): the quirk's own effect there."""
    from vllm.config import CompilationConfig

    from nrl_shim import activation

    return {
        "pid": os.getpid(),
        "patched": sorted(name for quirk_id, name in activation.patched() if quirk_id == "vllm-use-inductor"),
        "backend": CompilationConfig(**CONFIG).backend,
        "plugin_file": sys.modules["nrl_shim_example_quirks.vllm_use_inductor"].__file__,
    }


def main(model_dir, engine):
    from vllm.engine.arg_utils import EngineArgs

    out = {"pid": os.getpid()}
    try:
        out["engine_args_backend"] = EngineArgs(
            model=model_dir, compilation_config=dict(CONFIG)
        ).compilation_config.backend
    except Exception as exc:
        out["engine_args_error"] = f"{type(exc).__name__}: {exc}"
    if engine:
        from vllm import LLM, SamplingParams

        llm = LLM(model=model_dir, compilation_config=dict(CONFIG), **ENGINE_KW)
        out["llm_backend"] = llm.llm_engine.vllm_config.compilation_config.backend
        (out["vllm_process"],) = llm.collective_rpc(in_vllm_process)
        params = SamplingParams(temperature=0, max_tokens=2, detokenize=False)
        out["generated"] = len(llm.generate([{"prompt_token_ids": [5, 17, 42]}], params, use_tqdm=False))
    return out


if __name__ == "__main__":  # the engine core is spawned and re-imports this module
    print(json.dumps(main(sys.argv[1], sys.argv[2:] == ["engine"])))
