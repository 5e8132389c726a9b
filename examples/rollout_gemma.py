"""A rollout the way RL frameworks start one, with no import of nrl_shim: a tiny Gemma-3 policy checkpoint on disk
(random weights, written by transformers), a vLLM engine built with load_format="dummy" (frameworks refit the weights
later), and greedy tokens compared with what the policy itself generates.

    nrl-shim run -- python examples/rollout_gemma.py     # with the shim: the engine has the real weights
    python examples/rollout_gemma.py                     # without: dummy weights until a refit

Runs on vLLM's CPU build in about a minute (see README, "Try everything on a laptop"); the same command on a GPU box.
"""

import os
import sys
import tempfile
import time

PROMPTS = [[5, 17, 42, 7], [100, 3, 9], [11, 12, 13]]
NEW_TOKENS = 8


def say(message):
    print(f"[rollout_gemma {time.strftime('%H:%M:%S')}] {message}", flush=True)


def write_policy(directory):
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        sliding_window=64,
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    policy = Gemma3ForCausalLM(config).eval()
    policy.save_pretrained(directory, safe_serialization=True)
    return policy


def policy_greedy(policy):
    import torch

    out = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = list(prompt)
            for _ in range(NEW_TOKENS):
                ids.append(int(policy(torch.tensor([ids])).logits[0, -1].argmax()))
            out.append(ids[len(prompt) :])
    return out


def main():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: quicker on a laptop
    with tempfile.TemporaryDirectory(prefix="rollout-gemma-") as directory:
        say(f"writing a tiny Gemma-3 policy to {directory} ...")
        expected = policy_greedy(write_policy(directory))
        say("starting vLLM with load_format='dummy' (as RL frameworks do; ~10-30 s on a CPU) ...")
        from vllm import LLM, SamplingParams

        llm = LLM(
            model=directory,
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype="float32",
            max_model_len=128,
            enforce_eager=True,
            gpu_memory_utilization=0.2,
        )
        load_format = llm.llm_engine.vllm_config.load_config.load_format
        say(f"engine load_format: {getattr(load_format, 'value', load_format)}")
        params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, detokenize=False)
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outputs]
    same = sum(g == e for g, e in zip(got, expected))
    say(f"rollout tokens equal to the policy's own: {same}/{len(PROMPTS)}")
    if same == len(PROMPTS):
        print("verdict: OK - the rollout engine generates with the policy's real weights")
        return 0
    print("verdict: MISMATCH - the rollout engine runs on dummy weights (run it under `nrl-shim run --`)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
