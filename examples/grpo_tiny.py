"""A tiny GRPO loop written the way RL frameworks write one, with no import of nrl_shim: a Gemma-3 text policy trained
with torch, rollouts from a real vLLM engine built with load_format="dummy" (the framework refits the weights after
each training step), and NeMo RL's token_mult_prob_error to check that vLLM samples from the policy being trained.

    nrl-shim run -- python examples/grpo_tiny.py     # with the shim: rollouts match the policy from step 0
    python examples/grpo_tiny.py                     # without: step 0's rollouts come from dummy weights

The task is verifiable and learnable in a few steps: the reward of a completion is the fraction of its tokens with an
even id. Each step samples a group of completions per prompt, normalises rewards within the group (GRPO), takes one
policy-gradient step, then refits the engine in place with the new weights. Runs on vLLM's CPU build in about a
minute (see README, "Try everything on a laptop"); the same command on a GPU box.
Options: --steps N (default 4), --json PATH (per-step numbers, for bench/bench_grpo_step.py).
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time

PROMPTS = [[5, 17, 42, 7], [100, 3, 9, 61], [11, 12, 13, 14], [300, 1, 2, 3]]  # same length: no padding to train
GROUP_SIZE = 8
NEW_TOKENS = 8
LEARNING_RATE = 1e-2
# NeMo RL reports token_mult_prob_error = exp(mean |logprob_vllm - logprob_policy|); 1.0 is perfect agreement. This run
# is float32 on both sides, so agreement is ~1.0000 (measured); rollouts from weights the policy doesn't have give
# errors of several x (21x measured at step 0 from dummy weights). 1.05 leaves room for kernel noise (bf16 on a GPU
# drifts further than float32 here) and still flags a real gap.
THRESHOLD = 1.05


def say(message):
    print(f"[grpo_tiny {time.strftime('%H:%M:%S')}] {message}", flush=True)


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
    policy = Gemma3ForCausalLM(config).float()
    policy.save_pretrained(directory, safe_serialization=True)
    return policy


def reward(tokens):
    """The verifiable reward: the fraction of generated tokens with an even id."""
    return sum(t % 2 == 0 for t in tokens) / len(tokens)


def rollout(llm, step):
    """GROUP_SIZE sampled completions per prompt, each with vLLM's logprob of every sampled token."""
    from vllm import SamplingParams

    params = SamplingParams(
        n=GROUP_SIZE,
        temperature=1.0,
        max_tokens=NEW_TOKENS,
        ignore_eos=True,
        logprobs=0,  # only the sampled token's logprob
        seed=1000 + step,
        detokenize=False,
    )
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    groups = []
    for prompt, output in zip(PROMPTS, outputs):
        samples = []
        for completion in output.outputs:
            tokens = list(completion.token_ids)
            logprobs = [position[token].logprob for token, position in zip(tokens, completion.logprobs)]
            samples.append({"prompt": prompt, "tokens": tokens, "logprobs": logprobs})
        groups.append(samples)
    return groups


def train_step(policy, optimizer, groups):
    """One GRPO step (on-policy, so the importance ratio is 1 and the clipped objective is plain policy gradient).
    Returns the loss, the mean reward and the policy's pre-update logprobs of the sampled tokens."""
    import torch

    samples, advantages, rewards = [], [], []
    for group in groups:
        r = torch.tensor([reward(s["tokens"]) for s in group])
        advantages.append((r - r.mean()) / (r.std() + 1e-6))  # group-normalised
        rewards.append(r)
        samples.extend(group)
    advantages = torch.cat(advantages)
    ids = torch.tensor([s["prompt"] + s["tokens"] for s in samples])
    prompt_len = len(samples[0]["prompt"])
    logits = policy(ids).logits[:, prompt_len - 1 : -1].float()  # the positions that predicted each generated token
    token_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, prompt_len:, None]).squeeze(-1)
    loss = -(advantages[:, None] * token_logprobs).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach()), float(torch.cat(rewards).mean()), token_logprobs.detach()


def token_mult_prob_error(groups, policy_logprobs):
    import torch

    vllm_logprobs = torch.tensor([s["logprobs"] for group in groups for s in group])
    return math.exp(float((vllm_logprobs - policy_logprobs).abs().mean()))


def refit(llm, policy):
    """Push the policy's weights into the engine in place, as RL frameworks do after each step."""
    import inspect

    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    weights = ((name, tensor.detach()) for name, tensor in policy.state_dict().items())
    if "weights_iterator" in inspect.signature(getattr(runner, "reload_weights", lambda: None)).parameters:
        runner.reload_weights(weights_iterator=weights)  # in place; needed where linear weights are repacked (CPU)
    else:
        runner.model.load_weights(weights=weights)  # older vLLM, GPU


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", metavar="PATH", help="write per-step numbers here")
    args = parser.parse_args()
    # The engine core in this process (before vLLM is imported): quicker on a laptop, and its model is reachable.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch

    with tempfile.TemporaryDirectory(prefix="grpo-tiny-") as directory:
        say(f"writing a tiny Gemma-3 policy to {directory} ...")
        policy = write_policy(directory).train()
        optimizer = torch.optim.Adam(policy.parameters(), lr=LEARNING_RATE)
        say("starting vLLM with load_format='dummy' (as RL frameworks do; ~10-30 s on a CPU) ...")
        from vllm import LLM

        llm = LLM(
            model=directory,
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype="float32",
            max_model_len=128,
            enforce_eager=True,
            gpu_memory_utilization=0.05,  # on vLLM's CPU build: a fraction of host memory for the KV cache
        )
        load_format = llm.llm_engine.vllm_config.load_config.load_format
        load_format = str(getattr(load_format, "value", load_format))
        say(f"engine load_format: {load_format}")
        say(f"GRPO: {len(PROMPTS)} prompts x {GROUP_SIZE} samples x {NEW_TOKENS} tokens, reward = share of even ids")
        print(f"{'step':>4}  {'reward':>7}  {'loss':>8}  {'token_mult_prob_error':>21}  {'time (s)':>8}", flush=True)
        steps = []
        for step in range(args.steps):
            t0 = time.perf_counter()
            groups = rollout(llm, step)  # from the engine's current weights: the initial ones at step 0
            loss, mean_reward, policy_logprobs = train_step(policy, optimizer, groups)
            error = token_mult_prob_error(groups, policy_logprobs)
            refit(llm, policy)
            seconds = time.perf_counter() - t0
            steps.append(
                {"step": step, "reward": mean_reward, "loss": loss, "token_mult_prob_error": error, "seconds": seconds}
            )
            print(f"{step:>4}  {mean_reward:>7.3f}  {loss:>8.4f}  {error:>21.4f}  {seconds:>8.2f}", flush=True)
    bad = [s for s in steps if not s["token_mult_prob_error"] <= THRESHOLD]
    if bad:
        first = bad[0]
        why = "rollouts came from weights the policy doesn't have"
        if first["step"] == 0 and load_format == "dummy":
            why += ": the engine's dummy start-up weights (run it under `nrl-shim run --`)"
        verdict = f"MISMATCH — step {first['step']} token_mult_prob_error {first['token_mult_prob_error']:.1f} ({why})"
    else:
        worst = max(s["token_mult_prob_error"] for s in steps)
        verdict = f"OK — vLLM's logprobs match the policy at every step (max token_mult_prob_error {worst:.2f}x)"
    print(f"VERDICT: {verdict}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load_format": load_format, "threshold": THRESHOLD, "ok": not bad, "steps": steps}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
