"""A real vLLM engine (CPU build) with LoRA and prefix caching, whose adapter changes from A to B by each route an RL
loop uses, for test_vllm_lora_refit.py and bench/bench_lora_refit.py: `python lora_refit_engine.py CASE.json`.

CASE: {"mode": "llm" (LLM, engine core in this process) | "async" (AsyncLLM, engine core in its own process: a request
with adapter A streams across each change), "model", "a", "b" (adapter directories), "work" (a directory for the
adapters' copies), "prompt", "max_tokens", "routes": [...]}. Per route the prompt is served with A, the adapter becomes
B the route's way, and the prompt is served again; the routes use distinct names and ids in one engine. Then, as the
reference, the prefix cache is reset and the prompt served with A and with B under fresh names. Prints one JSON line:
per route its two rollouts (tokens, logprobs, cached prompt tokens), the references, and the `nrl_shim` records of
this process per route.

Routes: "fresh" (B under a new name and id: verl's and TRL's way), "inplace" (the files rewritten, the same name/id
with load_inplace=True), "newpath" (the same name/id at B's path), "remove" (remove_lora, the files rewritten, the same
name/id again: SkyRL's way), "remove_newpath" (remove_lora, the same name/id at B's path), "newid" (the files
rewritten, the same name under a new id: the OpenAI server's unload then load).
"""

import asyncio
import json
import logging
import os
import shutil
import sys
import time

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

ROUTES = ("fresh", "inplace", "newpath", "remove", "remove_newpath", "newid")


def engine_kw(case):
    return dict(
        model=case["model"],
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=1024,
        enforce_eager=True,
        enable_prefix_caching=True,
        enable_lora=True,
        max_lora_rank=8,
        max_loras=2,
        max_cpu_loras=4,
        kv_cache_memory_bytes=64 << 20,
        **case.get("engine", {}),
    )


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


def copy_adapter(source, directory):
    """The adapter's files copied into `directory`, each replacing the file there at once (a trainer saving a new
    version: an engine step reading the adapter meanwhile sees the old files or the new ones, never half of one)."""
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(source):
        target = os.path.join(directory, name)
        shutil.copyfile(os.path.join(source, name), target + ".tmp")
        os.replace(target + ".tmp", target)
    return directory


def plan(route, number, case):
    """(the LoRARequest serving A, what to do between, the LoRARequest serving B) for a route; ids 10*number + k."""
    from vllm.lora.request import LoRARequest

    work = os.path.join(case["work"], route)
    a_path = copy_adapter(case["a"], os.path.join(work, "a"))
    first = LoRARequest(route, 10 * number + 1, a_path)
    steps = []
    if route == "fresh":
        second = LoRARequest(route + "-b", 10 * number + 2, copy_adapter(case["b"], os.path.join(work, "b")))
    elif route == "inplace":
        steps = [("rewrite", a_path)]
        second = LoRARequest(route, first.lora_int_id, a_path, load_inplace=True)
    elif route == "newpath":
        second = LoRARequest(route, first.lora_int_id, copy_adapter(case["b"], os.path.join(work, "b")))
    elif route == "remove":
        steps = [("remove", first.lora_int_id), ("rewrite", a_path)]
        second = LoRARequest(route, first.lora_int_id, a_path)
    elif route == "remove_newpath":
        steps = [("remove", first.lora_int_id)]
        second = LoRARequest(route, first.lora_int_id, copy_adapter(case["b"], os.path.join(work, "b")))
    elif route == "newid":
        steps = [("rewrite", a_path)]
        second = LoRARequest(route, 10 * number + 2, a_path)
    else:
        raise ValueError(route)
    return first, steps, second


def references(case, number):
    from vllm.lora.request import LoRARequest

    work = os.path.join(case["work"], "reference")
    return {
        which: LoRARequest(f"reference-{which}", 10 * number + k, copy_adapter(case[which], os.path.join(work, which)))
        for k, which in ((1, "a"), (2, "b"))
    }


def change(steps, case, remove):
    for kind, value in steps:
        if kind == "rewrite":
            time.sleep(0.02)  # a later file timestamp tick, as between two RL steps
            copy_adapter(case["b"], value)
        else:
            remove(value)


def llm_case(case, records):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process (TRL's colocate engine)
    from vllm import LLM

    llm = LLM(**engine_kw(case))
    prompt = [{"prompt_token_ids": case["prompt"]}]

    def generate(lora):
        return rollout(llm.generate(prompt, params(case["max_tokens"]), lora_request=lora, use_tqdm=False)[0])

    results = {}
    for number, route in enumerate(case["routes"], start=1):
        start = len(records.messages)
        first, steps, second = plan(route, number, case)
        result = {"first": generate(first)}
        change(steps, case, llm.llm_engine.remove_lora)
        t0 = time.perf_counter()
        result["second"] = generate(second)
        result["seconds"] = time.perf_counter() - t0
        results[route] = {"result": result, "log": records.messages[start:]}
    llm.reset_prefix_cache()
    refs = references(case, len(case["routes"]) + 1)
    reference = {which: generate(lora) for which, lora in refs.items()}
    return {"routes": results, "reference": reference}


async def async_case(case):
    """AsyncLLM (engine core in its own process): per route a long request with A runs across the change."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kw(case)))
    try:

        async def generate(request_id, prompt, max_tokens, lora, progress=None):
            final = None
            async for output in engine.generate(
                {"prompt_token_ids": prompt}, params(max_tokens), request_id, lora_request=lora
            ):
                final = output
                if progress is not None:
                    progress["tokens"] = len(output.outputs[0].token_ids)
            return final

        async def remove(lora_id):
            await engine.remove_lora(lora_id)

        results = {}
        for number, route in enumerate(case["routes"], start=1):
            first, steps, second = plan(route, number, case)
            result = {"first": rollout(await generate(f"{route}-first", case["prompt"], case["max_tokens"], first))}
            progress = {"tokens": 0}
            # Not for "newid": a batch holding two ids under one name crashes vLLM's worker (its set of active
            # LoRARequests dedups by name: KeyError for the other id), with or without the fix.
            running = None
            if route != "newid":
                running = asyncio.ensure_future(
                    generate(f"{route}-long", case["long_prompt"], case["long_tokens"], first, progress)
                )
                while progress["tokens"] < 4 and not running.done():
                    await asyncio.sleep(0.01)
            for kind, value in steps:
                if kind == "remove":
                    await remove(value)
                else:
                    change([(kind, value)], case, None)
            at_change = {
                "long_running": running is not None and not running.done(),
                "long_generated": progress["tokens"],
            }
            result["second"] = rollout(await generate(f"{route}-second", case["prompt"], case["max_tokens"], second))
            if running is not None:
                long = await running
                result["long"] = {**at_change, "generated": len(long.outputs[0].token_ids)}
            results[route] = {"result": result}
        await engine.reset_prefix_cache()
        refs = references(case, len(case["routes"]) + 1)
        reference = {
            which: rollout(await generate(f"reference-{which}", case["prompt"], case["max_tokens"], lora))
            for which, lora in refs.items()
        }
        return {"routes": results, "reference": reference}
    finally:
        engine.shutdown()


if __name__ == "__main__":
    from log_records import Records  # next to this file (the script's directory is on sys.path)

    records = Records()
    logging.getLogger("nrl_shim").addHandler(records)
    with open(sys.argv[1]) as f:
        case = json.load(f)
    result = asyncio.run(async_case(case)) if case["mode"] == "async" else llm_case(case, records)
    print(json.dumps(result))
