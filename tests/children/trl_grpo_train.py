"""A GRPO training script as a TRL user writes it (no nrl_shim anywhere), for tests/test_trl.py:

    python trl_grpo_train.py MODEL_DIR OUTPUT_DIR RESULT.json

TRL 1.16's `GRPOTrainer` in colocate mode on a CPU: its own vLLM engine in this process, its own refits before each
generation (`model.load_weights`, one tensor per call), 2 steps on a tiny in-memory prompt set with a simple reward.
After training, one more `sync_weights()` (TRL refits before each generation, so after the last step the engine is one
update behind), then the engine's greedy tokens and their logprobs are compared with transformers' of the trained
policy and of the initial checkpoint. Writes RESULT.json; an error (e.g. a refit failing) propagates as in any script.
"""

import json
import sys

TRAIN_PROMPTS = [f"t{a} t{b} t{c}" for a, b, c in [(5, 17, 42), (100, 3, 9), (7, 8, 9)]] * 4  # word-level tokens
PROMPTS = [[5, 17, 42], [100, 3, 9, 11], [250, 251], [7, 8, 9, 10, 11]]  # token ids, for the check after training
MAX_TOKENS = 8


def even_token_reward(completion_ids, **kwargs):
    """A toy verifiable reward: the share of even token ids in each completion."""
    return [sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


def logprobs_of(model, prompt, tokens):
    """transformers' logprob of each of `tokens` continuing `prompt` (one forward pass)."""
    import torch

    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def max_gap(reference, engine):
    return max(abs(a - b) for ref, eng in zip(reference, engine) for a, b in zip(ref, eng))


def main(model_dir, output_dir, result_path):
    import copy

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from vllm import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = Dataset.from_dict({"prompt": TRAIN_PROMPTS})
    args = GRPOConfig(
        output_dir=output_dir,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.05,  # of host RAM on the CPU build
        vllm_max_model_length=128,
        use_cpu=True,
        bf16=False,
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=MAX_TOKENS,
        learning_rate=0.05,  # large enough that 2 steps move a tiny random model visibly
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=even_token_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()

    llm = trainer.vllm_generation.llm
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)

    def engine_generate():
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy, use_tqdm=False)
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        logprobs = [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outputs]
        return tokens, logprobs

    stale_tokens, stale_logprobs = engine_generate()  # the engine as the last step's generation left it
    trainer.vllm_generation.sync_weights()
    tokens, logprobs = engine_generate()

    policy = trainer.model.eval()
    policy_bf16 = copy.deepcopy(policy).to(torch.bfloat16)  # the engine's dtype
    initial = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    policy_logprobs = [logprobs_of(policy_bf16, p, t) for p, t in zip(PROMPTS, tokens)]
    initial_logprobs = [logprobs_of(initial, p, t) for p, t in zip(PROMPTS, tokens)]

    def greedy_of(model):
        out = []
        with torch.no_grad():
            for prompt in PROMPTS:
                ids = list(prompt)
                for _ in range(MAX_TOKENS):
                    ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
                out.append(ids[len(prompt) :])
        return out

    model_config = llm.llm_engine.vllm_config.model_config
    result = {
        "global_step": trainer.state.global_step,
        "history": [
            {k: v for k, v in entry.items() if k in ("step", "loss", "reward")} for entry in trainer.state.log_history
        ],
        "engine": {
            "dtype": str(model_config.dtype),
            "enforce_eager": model_config.enforce_eager,
            "load_format": str(llm.llm_engine.vllm_config.load_config.load_format),
        },
        "engine_tokens": tokens,
        "stale_tokens": stale_tokens,
        "policy_greedy_bf16": greedy_of(policy_bf16),
        "initial_greedy_bf16": greedy_of(initial),
        "gap_to_policy": max_gap(policy_logprobs, logprobs),
        "gaps_to_policy": [
            [round(abs(a - b), 4) for a, b in zip(ref, eng)] for ref, eng in zip(policy_logprobs, logprobs)
        ],
        "gap_to_initial": max_gap(initial_logprobs, logprobs),
        "stale_gap_to_policy": max_gap(
            [logprobs_of(policy_bf16, p, t) for p, t in zip(PROMPTS, stale_tokens)], stale_logprobs
        ),
    }
    with open(result_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
