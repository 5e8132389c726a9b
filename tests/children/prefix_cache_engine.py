"""A real vLLM engine (CPU build) refit in place between two rollouts of the same prompt, for
test_vllm_prefix_cache_refit.py: `python prefix_cache_engine.py CASES.json` (a list). The shim is on or off as the environment
the test gives this process says, as in a job.

The engine starts with dummy weights, is refit to checkpoint A (the frameworks' way), generates the prompt (its KV
blocks enter the prefix cache), is refit to checkpoint B and generates the same prompt again. The second rollout must
be B's: with a stale prefix cache it reads A's KV for the cached prefix.

Modes: "inproc" (engine core in this process, the model refit directly as TRL's colocate engine is), "mp" (engine core
in its own process, refits through LLM.apply_model), "load" (AsyncLLM: a request streaming through refits made with
collective_rpc, as verl's and NeMo RL's workers make them; groups sharing a prompt after each). Prints one JSON line:
per case of the list given, its rollouts (tokens, logprobs, cached prompt tokens) and the `nrl_shim` records of this
process.
"""

import asyncio
import gc
import json
import logging
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)  # tiny_models, prefix_cache_refit (and for the engine's own processes:)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # a function sent to the workers
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

ENGINE_KW = dict(
    skip_tokenizer_init=True,
    dtype="float32",
    max_model_len=1024,
    enforce_eager=True,
    load_format="dummy",
)


def engine_kw(case):
    """The engine's arguments: a small KV cache (kv_cache_memory_bytes from 0.11; before it VLLM_CPU_KVCACHE_SPACE's
    GiB, set above) and the case's own."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    small = {"kv_cache_memory_bytes": 64 << 20}
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    return {**ENGINE_KW, **{k: v for k, v in small.items() if k in fields}, **case.get("engine", {})}


def params(max_tokens):
    from vllm import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False, logprobs=0)


def rollout(output):
    completion = output.outputs[0]
    return {
        "tokens": list(completion.token_ids),
        "logprobs": [entry[token].logprob for token, entry in zip(completion.token_ids, completion.logprobs)],
        "cached": output.num_cached_tokens or 0,
    }


def sync_case(case):
    import functools

    from prefix_cache_refit import refit_model
    from vllm import LLM

    if case["mode"] == "inproc":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    llm = LLM(model=case["model_a"], enable_prefix_caching=case["prefix_caching"], **engine_kw(case))
    if case["mode"] == "inproc":  # TRL's colocate refit: the model object, no RPC
        engine = llm.llm_engine
        executor = (
            getattr(engine, "model_executor", None) or engine.engine_core.engine_core.model_executor
        )  # <0.10: V1's
        model = executor.driver_worker.worker.model_runner.model

        def refit(path):
            refit_model(model, path)
    else:

        def refit(path):
            llm.apply_model(functools.partial(refit_model, path=path))

    prompt = [{"prompt_token_ids": case["prompt"]}]
    refit(case["model_a"])
    first = rollout(llm.generate(prompt, params(case["max_tokens"]), use_tqdm=False)[0])
    refit(case["model_b"])
    if case.get("caller_resets"):
        llm.reset_prefix_cache()
    second = rollout(llm.generate(prompt, params(case["max_tokens"]), use_tqdm=False)[0])
    return {"first": first, "second": second}


async def load_case(case):
    """Async RL's load: one long request runs through every refit (streaming), refits alternate the two policies, and
    after each a GRPO group of 8 shares one prompt. After the first refit two echo requests: the long request's own
    prompt (its blocks were computed before the refit), then that prompt plus its first tokens (a block the long
    request filled after the refit: its new tokens attend to old-weights KV)."""
    from prefix_cache_refit import refit_worker
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(model=case["model_a"], enable_prefix_caching=case["prefix_caching"], **engine_kw(case))
    engine = AsyncLLM.from_engine_args(args)
    try:

        async def generate(request_id, prompt, max_tokens):
            final = None
            async for output in engine.generate({"prompt_token_ids": prompt}, params(max_tokens), request_id):
                final = output
            return final

        long_prompt, progress = case["long_prompt"], {"tokens": []}

        async def long_request():
            final = None
            async for output in engine.generate({"prompt_token_ids": long_prompt}, params(case["long_tokens"]), "long"):
                final, progress["tokens"] = output, list(output.outputs[0].token_ids)
            return final

        async def until_generated(count):
            while len(progress["tokens"]) < count and not running.done():
                await asyncio.sleep(0.01)

        await engine.collective_rpc(refit_worker, args=(case["model_a"],))
        first = rollout(await generate("first", case["prompt"], case["max_tokens"]))
        running = asyncio.ensure_future(long_request())
        await until_generated(4)
        groups, echoes = [], {}
        for step, policy in enumerate(case["policies"]):
            await engine.collective_rpc(refit_worker, args=(case["model_" + policy],))
            at_refit = {"long_running": not running.done(), "long_generated": len(progress["tokens"])}
            members = await asyncio.gather(
                *(generate(f"group{step}-{i}", case["prompt"], case["max_tokens"]) for i in range(case["group"]))
            )
            groups.append({"policy": policy, **at_refit, "members": [rollout(m) for m in members]})
            if step == 0:
                echoes["prompt"] = rollout(await generate("echo-prompt", long_prompt, case["max_tokens"]))
                await until_generated(case["echo_tokens"])
                echoes["extended_prompt"] = long_prompt + progress["tokens"][: case["echo_tokens"]]
                echoes["extended"] = rollout(
                    await generate("echo-extended", echoes["extended_prompt"], case["max_tokens"])
                )
        final = await running
        return {"first": first, "groups": groups, "echoes": echoes, "long": len(final.outputs[0].token_ids)}
    finally:
        engine.shutdown()


if __name__ == "__main__":
    from log_records import Records  # next to this file (the script's directory is on sys.path)

    records = Records()
    logging.getLogger("nrl_shim").addHandler(records)
    results = []
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    for case in cases:  # a list: in-process engines one after another (same environment)
        start = len(records.messages)
        result = asyncio.run(load_case(case)) if case["mode"] == "load" else sync_case(case)
        results.append({"result": result, "log": records.messages[start:]})
        gc.collect()
    print(json.dumps({"cases": results}))
