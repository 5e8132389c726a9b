"""Real vLLM engines on the CPU build, driven by test_vllm_cpu_engines.py: `python vllm_engine_child.py CASE.json`.

Prints one JSON line. The shim is activated (or not) by the environment the test gives this process, as in a job.
"""

import asyncio
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ENGINE_KW = dict(
    skip_tokenizer_init=True, dtype="float32", max_model_len=128, enforce_eager=True, gpu_memory_utilization=0.2
)  # on the CPU build, a fraction of host memory for the KV cache
PROMPTS = [[5, 17, 42, 7], [100, 3, 9], [11, 12], [300, 1, 2, 3, 4], [77], [8, 8, 8], [250, 251], [42, 43, 44]]


def sampling_params(max_tokens):
    from vllm import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)


def load_format_of(engine_config):
    value = engine_config.load_config.load_format
    return str(getattr(value, "value", value))


def case_llm(case):
    """LLM(load_format=...) as RL frameworks build it; greedy tokens before and after an in-place refit."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process, so the model is reachable
    from vllm import LLM

    from tiny_models import state_dict_items

    llm = LLM(model=case["model"], load_format=case["load_format"], **ENGINE_KW)
    params = sampling_params(case["max_tokens"])

    def generate():
        outputs = llm.generate([{"prompt_token_ids": p} for p in case["prompts"]], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]

    before = generate()
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    runner.reload_weights(weights_iterator=iter(state_dict_items(case["model"])))
    return {"load_format": load_format_of(llm.llm_engine.vllm_config), "before": before, "after": generate()}


async def _stream(engine, prompt, request_id, max_tokens, started=None):
    tokens = []
    async for output in engine.generate({"prompt_token_ids": prompt}, sampling_params(max_tokens), request_id):
        tokens = list(output.outputs[0].token_ids)
        if started is not None:
            started.set()
    return tokens


async def _all_streams(engine, tag, max_tokens, cancel_index=None):
    started = asyncio.Event()
    tasks = [
        asyncio.ensure_future(_stream(engine, p, f"{tag}-{i}", max_tokens))
        for i, p in enumerate(PROMPTS)
        if i != cancel_index
    ]
    if cancel_index is not None:
        # The one to cancel asks for many tokens, so it is surely mid-stream when its caller gives up.
        victim = asyncio.ensure_future(_stream(engine, PROMPTS[cancel_index], f"{tag}-victim", 100, started))
        tasks.insert(cancel_index, victim)
        await started.wait()
        victim.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    return [r if isinstance(r, list) else f"{type(r).__name__}: {r}" for r in results]


async def _unfinished(engine):
    for _ in range(100):  # aborts travel to the engine core process; give them a moment
        count = engine.output_processor.get_num_unfinished_requests()
        if count == 0:
            break
        await asyncio.sleep(0.05)
    return count


async def case_async(case):
    """8 concurrent AsyncLLM streams over a real engine (its core in a spawned process)."""
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    import nrl_shim

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=case["model"], **ENGINE_KW))
    out = {"shim_active": nrl_shim.is_active()}
    try:
        if case["mode"] == "timeout":
            out["streams"] = await _all_streams(engine, "stall", case["max_tokens"])
            out["unfinished"] = await _unfinished(engine)
            nrl_shim.deactivate()  # the next request, under the default timeout
            os.environ.pop("NRL_VLLM_ASYNC_TIMEOUT_SECONDS")
            nrl_shim.activate()
            out["next"] = await _stream(engine, PROMPTS[0], "next", case["max_tokens"])
        else:
            out["with_shim"] = await _all_streams(engine, "shim", case["max_tokens"])
            out["cancel_one"] = await _all_streams(engine, "cancel", case["max_tokens"], cancel_index=3)
            out["unfinished"] = await _unfinished(engine)
            nrl_shim.deactivate()
            out["without_shim"] = await _all_streams(engine, "plain", case["max_tokens"])
    finally:
        engine.shutdown()
    return out


def main():
    case = json.loads(open(sys.argv[1]).read())
    result = case_llm(case) if case["kind"] == "llm" else asyncio.run(case_async(case))
    print(json.dumps(result))


if __name__ == "__main__":  # AsyncLLM spawns its engine core, which re-imports this module
    main()
