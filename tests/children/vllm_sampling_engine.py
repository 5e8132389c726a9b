"""vLLM's sampling defaults on real engines (CPU build), for tests/vllm_sampling_runs.py (the sampling fixes' tests):
`python vllm_sampling_engine.py MODEL_DIR CASES.json`. MODEL_DIR's generation_config.json carries sampling values
(top_k 1, top_p 0.001, temperature 0.1). Per case: an in-process `LLM` (keyword arguments from the case), then
- `distinct`: distinct completions of 8 requests made with no sampling params (vLLM's defaults then apply),
- `logprob_gap`: the largest |vLLM's logprob - transformers' log_softmax(logits / 0.5)| over 8 tokens sampled at
  temperature 0.5,
- what the engine's config says (generation_config, logprobs_mode) and the eos id its input processor stops on,
- `truncated`: per sampling setting (T in {0.7, 1.0} x top_p 0.8 / top_k 5 / min_p 0.1; 8 tokens, 3 alternatives a
  step), the largest |vLLM's logprob - transformers' full-vocabulary log_softmax(logits / T)| over every logprob
  returned (sampled tokens and alternatives).
A case with "route": "async": an `AsyncLLM` (its engine core in a child process, as vLLM starts it), `truncated` only.
A case with "argv": vLLM's own command-line parser (`vllm serve`'s) given that argument list, as verl's server does,
then `AsyncEngineArgs.from_cli_args(...).create_engine_config()`: the config only, no engine.
Prints one JSON line: {"cases": {...}, "log": [[level, message], ...], "env": VLLM_ENFORCE_STRICT_TOOL_CALLING}.
"""

import gc
import json
import logging
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: its config is reachable
PROMPT = [5, 17, 42]
TEMPERATURE = 0.5
TOKENS = 8
TRUNCATING = {
    f"T{t}-{name}": {"temperature": t, name: value}
    for t in (0.7, 1.0)
    for name, value in (("top_p", 0.8), ("top_k", 5), ("min_p", 0.1))
}  # the sampling settings under which vLLM's processed logprobs are renormalised over the tokens kept


def transformers_logprobs(directory, tokens, temperature=TEMPERATURE):
    """The trainer's: the full-vocabulary log_softmax(logits / T) at each of `tokens`' positions, [len(tokens), V]."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + tokens])).logits[0, len(PROMPT) - 1 : -1]
    return torch.log_softmax(logits / temperature, -1)


def truncated_gaps(llm, directory):
    from vllm import SamplingParams

    gaps = {}
    for name, setting in TRUNCATING.items():
        params = SamplingParams(max_tokens=TOKENS, logprobs=3, seed=1, ignore_eos=True, detokenize=False, **setting)
        out = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs[0]
        reference = transformers_logprobs(directory, list(out.token_ids), setting["temperature"])
        gaps[name] = max(
            abs(entry.logprob - reference[step, token].item())
            for step, alternatives in enumerate(out.logprobs)
            for token, entry in alternatives.items()
        )
    return gaps


def engine_case(directory, kwargs):
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=directory, skip_tokenizer_init=True, dtype="float32", max_model_len=128, enforce_eager=True, **kwargs
    )
    config = llm.llm_engine.vllm_config.model_config
    params = SamplingParams(
        temperature=TEMPERATURE, max_tokens=TOKENS, logprobs=0, seed=1, ignore_eos=True, detokenize=False
    )
    out = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs[0]
    tokens = list(out.token_ids)
    engine = [step[token].logprob for token, step in zip(tokens, out.logprobs)]
    reference = transformers_logprobs(directory, tokens)[range(len(tokens)), tokens].tolist()
    defaults = llm.generate([{"prompt_token_ids": PROMPT}] * 8, None, use_tqdm=False)
    fields = getattr(getattr(llm.llm_engine, "input_processor", None), "generation_config_fields", None) or {}
    return {
        "generation_config": config.generation_config,
        "logprobs_mode": str(config.logprobs_mode),
        "eos_token_id": fields.get("eos_token_id"),
        "distinct": len({tuple(o.outputs[0].token_ids) for o in defaults}),
        "logprob_gap": max(abs(a - b) for a, b in zip(engine, reference)),
        "truncated": truncated_gaps(llm, directory),
    }


def async_case(directory, kwargs):
    import asyncio

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # the engine core in its own process: the config travels there
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine_args = AsyncEngineArgs(
        model=directory, skip_tokenizer_init=True, dtype="float32", max_model_len=128, enforce_eager=True, **kwargs
    )
    engine = AsyncLLM.from_engine_args(engine_args)

    async def generate_all():
        outputs = {}
        for name, setting in TRUNCATING.items():  # one event loop: AsyncLLM's output handler lives on it
            params = SamplingParams(max_tokens=TOKENS, logprobs=3, seed=1, ignore_eos=True, detokenize=False, **setting)
            async for output in engine.generate({"prompt_token_ids": PROMPT}, params, name):
                outputs[name] = output.outputs[0]
        return outputs

    try:
        outputs = asyncio.run(generate_all())
    finally:
        engine.shutdown()
    gaps = {}
    for name, out in outputs.items():
        reference = transformers_logprobs(directory, list(out.token_ids), TRUNCATING[name]["temperature"])
        gaps[name] = max(
            abs(entry.logprob - reference[step, token].item())
            for step, alternatives in enumerate(out.logprobs)
            for token, entry in alternatives.items()
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return {"truncated": gaps}


def cli_case(directory, argv):
    # As verl's server does: vLLM's own parser given an argument list (this process's sys.argv names no vLLM flag).
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    args = parser.parse_args(["--model", directory, *argv])
    config = AsyncEngineArgs.from_cli_args(args).create_engine_config().model_config
    return {"generation_config": config.generation_config, "logprobs_mode": str(config.logprobs_mode)}


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from log_records import Records

    records = Records()
    logging.getLogger("nrl_shim").addHandler(records)
    directory, cases = sys.argv[1], json.loads(sys.argv[2])
    results = {}
    for name, case in cases.items():
        if "argv" in case:
            results[name] = cli_case(directory, case["argv"])
        elif case.get("route") == "async":
            results[name] = async_case(directory, case.get("kwargs", {}))
        else:
            results[name] = engine_case(directory, case.get("kwargs", {}))
        gc.collect()
    strict = os.environ.get("VLLM_ENFORCE_STRICT_TOOL_CALLING")
    print(json.dumps({"cases": results, "log": records.messages, "strict_tool_calling": strict}))
