"""A tiny GRPO loop written the way RL frameworks write one today, with no import of nrl_shim: a policy trained with
torch, rollouts from a real vLLM engine (load_format="dummy", prefix caching on, vLLM's defaults otherwise), every
prompt behind one long shared system prompt, the policy's weights refit into the engine before every rollout,
sampling at temperature 0.7, and the engine's logprobs used in the loss (the PPO/GRPO ratio's "old" logprobs). It
reports NeMo RL's token_mult_prob_error per step: exp(mean |engine logprob - policy logprob|), 1.0 = the rollouts come
from the policy being trained.

    nrl-shim run -- python examples/grpo_tiny.py          # with the shim
    python examples/grpo_tiny.py                          # without
    python examples/grpo_tiny.py --moe                    # a mixture-of-experts policy (Qwen3-MoE)

When a step mismatches, the run finds out why from its own numbers: it refits once more and samples the same requests
twice, with the engine's prefix cache as it is and after resetting it, and compares the engine's logprobs with the
policy's at temperature 0.7 and at 1.0. A gap that goes away with the reset is stale KV (blocks computed before the
refit); logprobs equal to the policy's at 1.0 are taken before temperature; a gap that stays is weights the engine
doesn't have (a refit that didn't land as written). The reward of a completion is the share of its tokens with an
even id. The Gemma dummy-weights bug of vLLM < 0.9.2 has its own example: examples/grpo_gemma.py.
Refits go through vLLM's own in-place `reload_weights` (on the CPU build the route that keeps its packed linear layers
right without the shim). Its fused-MoE experts still come out scrambled there, with no error: vLLM skips their CPU
prepack on a weight update; on a GPU a `load_weights` refit (what NeMo RL, verl and TRL call) scrambles them the same
way (vllm-project/vllm#42821). Options: --steps N (default 4), --moe, --dtype float32|bfloat16 (the engine's; vLLM
0.9.1 on a CPU: its V0 | V1 engine), --top-p P (nucleus sampling: vLLM's processed
logprobs are then renormalised over the kept tokens, the loss's are not), --verbose (vLLM's own logs), --json PATH.
"""

import argparse
import contextlib
import json
import logging
import math
import os
import random
import sys
import tempfile
import time
import warnings

VOCAB = 512
SYSTEM_PROMPT = [random.Random(0).randrange(3, VOCAB) for _ in range(136)]  # longer than one KV block (CPU: 128)
QUESTIONS = [[5, 17, 42, 7], [100, 3, 9, 61], [11, 12, 13, 14], [300, 1, 2, 3]]  # same length: no padding to train
PROMPTS = [SYSTEM_PROMPT + question for question in QUESTIONS]
GROUP_SIZE = 8
NEW_TOKENS = 8
TEMPERATURE = 0.7
TOP_P = 1.0  # --top-p: nucleus sampling, as many GRPO recipes use (0.8-0.95); the trainer scores the full vocabulary
LEARNING_RATE = 1e-2
CLIP = 0.2
# token_mult_prob_error of 1.0 is perfect agreement; float32 on both sides measures ~1.000 here. 1.05 leaves room for
# kernel noise (bf16 on a GPU drifts further) and still flags a real gap.
THRESHOLD = 1.05


def say(message):
    print(f"[grpo_tiny {time.strftime('%H:%M:%S')}] {message}", flush=True)


def write_policy(directory, moe):
    import torch
    from transformers import AutoModelForCausalLM

    if moe:
        from transformers import Qwen3MoeConfig as Config

        shape = dict(hidden_size=128, head_dim=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64)
        shape.update(norm_topk_prob=True)
    else:
        from transformers import LlamaConfig as Config

        shape = dict(hidden_size=64, head_dim=32)
    config = Config(
        vocab_size=VOCAB,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        initializer_range=0.3,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        **shape,
    )
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_config(config).float()
    policy.save_pretrained(directory, safe_serialization=True)
    write_tokenizer(directory)
    return policy


def write_tokenizer(directory):
    """A word-level tokenizer ("t0", "t1", ...): vLLM 0.9's V1 engine loads one even with skip_tokenizer_init (the
    same as examples/grpo_gemma.py's; each example stands alone)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0", "eos_token": "t1"}, f)


def reward(tokens):
    """The verifiable reward: the share of generated tokens with an even id."""
    return sum(t % 2 == 0 for t in tokens) / len(tokens)


def rollout(llm, seed):
    """GROUP_SIZE sampled completions per prompt, with vLLM's logprob of each sampled token and the prompt tokens it
    served from its prefix cache."""
    from vllm import SamplingParams

    params = SamplingParams(
        n=GROUP_SIZE,
        temperature=TEMPERATURE,
        top_p=TOP_P,
        max_tokens=NEW_TOKENS,
        ignore_eos=True,
        logprobs=0,  # only the sampled token's logprob
        seed=seed,
        detokenize=False,
    )
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    groups, cached = [], []
    for prompt, output in zip(PROMPTS, outputs):
        cached.append(output.num_cached_tokens or 0)
        samples = []
        for completion in output.outputs:
            tokens = list(completion.token_ids)
            logprobs = [position[token].logprob for token, position in zip(tokens, completion.logprobs)]
            samples.append({"prompt": prompt, "tokens": tokens, "logprobs": logprobs})
        groups.append(samples)
    return groups, sum(cached) / len(cached)


def policy_logprobs(policy, groups, temperature, top_p=1.0):
    """The policy's logprobs of the sampled tokens at `temperature`, what a trainer computes (with grad): over the full
    vocabulary; with top_p < 1, renormalised over the tokens top-p keeps (what vLLM's processed logprobs are)."""
    import torch

    samples = [s for group in groups for s in group]
    ids = torch.tensor([s["prompt"] + s["tokens"] for s in samples])
    prompt_len = len(samples[0]["prompt"])
    logits = policy(ids).logits[:, prompt_len - 1 : -1].float() / temperature  # the positions that predicted each token
    if top_p < 1.0:
        ordered, order = logits.sort(dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        dropped = probs.cumsum(dim=-1) - probs >= top_p  # the mass before it already reaches top_p (the first stays)
        logits = logits.scatter(-1, order, ordered.masked_fill(dropped, float("-inf")))
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, prompt_len:, None]).squeeze(-1)


def engine_logprobs(groups):
    import torch

    return torch.tensor([s["logprobs"] for group in groups for s in group])


def mult_prob_error(engine, policy):
    return math.exp(float((engine - policy).abs().mean()))


def train_step(policy, optimizer, groups):
    """One GRPO step with the clipped objective; the ratio's old logprobs are the engine's, as frameworks do. Returns
    the loss, the mean reward and token_mult_prob_error against the policy's pre-update logprobs."""
    import torch

    rewards = [torch.tensor([reward(s["tokens"]) for s in group]) for group in groups]
    advantages = torch.cat([(r - r.mean()) / (r.std() + 1e-6) for r in rewards])[:, None]  # group-normalised
    current = policy_logprobs(policy, groups, TEMPERATURE)
    old = engine_logprobs(groups)
    ratio = torch.exp(current - old)
    loss = -torch.min(ratio * advantages, ratio.clamp(1 - CLIP, 1 + CLIP) * advantages).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach()), float(torch.cat(rewards).mean()), mult_prob_error(old, current.detach())


def model_runner(llm):
    """The engine's model runner (engine core in this process)."""
    engine = llm.llm_engine
    executor = getattr(engine, "model_executor", None)
    if executor is None:
        executor = engine.engine_core.engine_core.model_executor
    worker = executor.driver_worker
    return getattr(worker, "worker", worker).model_runner


def refit(llm, policy, moe):
    """Push the policy's weights into the engine in place, as RL frameworks do before each rollout."""
    runner = model_runner(llm)
    weights = [(name, tensor.detach()) for name, tensor in policy.state_dict().items()]
    if hasattr(runner, "reload_weights"):
        runner.reload_weights(weights_iterator=weights)  # vLLM's in-place reload (the layers it re-laid out included)
    else:
        runner.model.load_weights(weights=weights)  # what NeMo RL, verl and TRL call


def diagnose(llm, policy, moe, seed):
    """Why the rollouts differ from the policy, measured: refit, sample the same requests with the prefix cache as it
    is and after a reset, and compare the engine's logprobs with the policy's at TEMPERATURE and at 1.0."""
    import torch

    refit(llm, policy, moe)
    found = {}
    with torch.no_grad():
        for label in ("as cached", "after reset"):
            if label == "after reset":
                llm.reset_prefix_cache()
            groups, cached = rollout(llm, seed)
            engine = engine_logprobs(groups)
            found[label] = {
                "cached": cached,
                "at_T": mult_prob_error(engine, policy_logprobs(policy, groups, TEMPERATURE)),
                "at_1": mult_prob_error(engine, policy_logprobs(policy, groups, 1.0)),
                "truncated": mult_prob_error(engine, policy_logprobs(policy, groups, TEMPERATURE, TOP_P)),
            }
    fresh, kept = found["after reset"], found["as cached"]
    causes = []
    if min(fresh["at_T"], fresh["at_1"], fresh["truncated"]) > THRESHOLD:
        causes.append(
            f"weights: with a fresh prefix the engine's logprobs still differ ({fresh['at_T']:.3g}x at T={TEMPERATURE}, "
            f"{fresh['at_1']:.3g}x at T=1): its weights are not the policy's after the refit (a refit that didn't land "
            "as written; MoE experts and the CPU build's packed layers are re-laid out after loading)"
        )
    if fresh["at_1"] <= THRESHOLD < fresh["at_T"]:
        causes.append(
            f"logprobs before temperature: the engine's equal the policy's log_softmax(logits) ({fresh['at_1']:.3g}x), "
            f"not log_softmax(logits / {TEMPERATURE}) ({fresh['at_T']:.3g}x), which the loss uses "
            "(vLLM's logprobs_mode='raw_logprobs')"
        )
    if TOP_P < 1.0 and fresh["truncated"] <= THRESHOLD < min(fresh["at_T"], fresh["at_1"]):
        causes.append(
            f"logprobs renormalised over the tokens top_p={TOP_P} kept: the engine's equal the policy's truncated "
            f"log_softmax ({fresh['truncated']:.3g}x), not the full-vocabulary log_softmax(logits / {TEMPERATURE}) "
            f"({fresh['at_T']:.3g}x) the loss uses (vLLM's logprobs_mode='processed_logprobs')"
        )
    best = min(("at_T", "at_1", "truncated"), key=lambda name: fresh[name])
    if kept[best] > THRESHOLD >= fresh[best]:
        # vLLM's V0 engine (0.9.1's CPU build runs float32 there) never counts the prompt tokens it takes from its
        # prefix cache: the reset closing the gap is what shows the stale blocks then.
        taken = (
            f"each request took {kept['cached']:.0f} prompt tokens from the prefix cache"
            if kept["cached"] > 0
            else "the requests read prompt KV from the prefix cache (the engine reported 0 cached tokens: vLLM's V0 "
            "engine doesn't count them)"
        )
        causes.append(
            f"stale KV: after the refit {taken}, computed with earlier weights ({kept[best]:.3g}x); with the cache "
            f"reset the same requests match ({fresh[best]:.3g}x)"
        )
    return causes or ["not found: the gap did not reproduce in the check (see the steps above)"], found


class ShimLog(logging.Handler):
    """What the `nrl_shim` logger said, if the shim runs in this process (read through logging, no import)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append((record.levelname, record.getMessage()))


def quiet_libraries(verbose):
    if verbose:
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' "Writing model shards" bar
    warnings.filterwarnings("ignore")


@contextlib.contextmanager
def native_stderr_kept_back(verbose):
    """C++ extensions print import-time warnings straight to file descriptor 2, past Python's logging. Hold them back
    while vLLM imports; show them if the import fails. nrl_shim's own lines pass through."""
    if verbose:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            for line in sink.read().decode(errors="replace").splitlines():
                if failed or line.startswith("nrl_shim"):
                    print(line, file=sys.stderr, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--moe", action="store_true", help="a Qwen3-MoE policy (8 experts, top-2)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the engine's dtype (the policy trains in float32; vLLM 0.9.1 on a CPU: float32 runs V0, bfloat16 V1)",
    )
    parser.add_argument("--verbose", action="store_true", help="show vLLM's and transformers' own logs")
    parser.add_argument("--json", metavar="PATH", help="write per-step numbers here")
    parser.add_argument("--top-p", type=float, default=1.0, help="sample with this top_p (default 1.0: off)")
    args = parser.parse_args()
    global TOP_P
    TOP_P = args.top_p
    quiet_libraries(args.verbose)
    # The engine core in this process (before vLLM is imported): quicker on a laptop, and its model is reachable.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # vLLM's CPU build: a fixed KV cache (GiB). Its default, a fraction of the memory node the process runs on, minus
    # what the process already holds, is below zero on a machine whose node 0 is small (8 GiB seen here).
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    shim_log = ShimLog()
    logging.getLogger("nrl_shim").addHandler(shim_log)
    import torch

    kind = "Qwen3-MoE" if args.moe else "Llama"
    with tempfile.TemporaryDirectory(prefix="grpo-tiny-") as directory:
        say(f"writing a tiny {kind} policy to {directory} ...")
        policy = write_policy(directory, args.moe).train()
        optimizer = torch.optim.Adam(policy.parameters(), lr=LEARNING_RATE)
        say("starting vLLM with load_format='dummy', as RL frameworks do (~10-60 s on a CPU) ...")
        with native_stderr_kept_back(args.verbose):
            import vllm
            from vllm import LLM

        with native_stderr_kept_back(args.verbose):  # also the CPU build's NUMA binding notice at engine start
            llm = LLM(
                model=directory,
                load_format="dummy",
                skip_tokenizer_init=True,
                dtype=args.dtype,
                max_model_len=256,
                enforce_eager=True,
                enable_prefix_caching=True,
                gpu_memory_utilization=0.05,  # on GPUs; the CPU build takes VLLM_CPU_KVCACHE_SPACE
            )
        say(
            f"vLLM {vllm.__version__} ({args.dtype}); GRPO: {len(PROMPTS)} prompts ({len(SYSTEM_PROMPT)}-token shared system prompt) x "
            f"{GROUP_SIZE} samples x {NEW_TOKENS} tokens at T={TEMPERATURE}"
            + (f", top_p={TOP_P}" if TOP_P < 1.0 else "")
            + ", a refit before each rollout"
        )
        print(f"{'step':>4}  {'reward':>6}  {'loss':>8}  {'cached/req':>10}  {'token_mult_prob_error':>21}", flush=True)
        steps, last_bad = [], None
        for step in range(args.steps):
            t0 = time.perf_counter()
            refit(llm, policy, args.moe)  # the policy's current weights into the engine, before its rollouts
            groups, cached = rollout(llm, seed=1000 + step)
            weights_now = {name: tensor.detach().clone() for name, tensor in policy.state_dict().items()}
            loss, mean_reward, error = train_step(policy, optimizer, groups)
            if not error <= THRESHOLD:
                last_bad = (step, weights_now)  # the policy this step's rollouts should have come from
            seconds = time.perf_counter() - t0
            steps.append(
                {
                    "step": step,
                    "reward": mean_reward,
                    "loss": loss,
                    "cached": cached,
                    "token_mult_prob_error": error,
                    "seconds": seconds,
                }
            )
            print(f"{step:>4}  {mean_reward:>6.3f}  {loss:>8.4f}  {cached:>10.0f}  {error:>21.4f}", flush=True)
        bad = [s for s in steps if not s["token_mult_prob_error"] <= THRESHOLD]
        causes, checks = [], {}
        if last_bad is not None:
            # The check runs on the policy of the last step that mismatched (the one a stale prefix is furthest from).
            policy.load_state_dict(last_bad[1])
            causes, checks = diagnose(llm, policy, args.moe, seed=1000 + last_bad[0])
    shim_active = "nrl_shim" in sys.modules and sys.modules["nrl_shim"].is_active()
    changed = sorted({m.split("]")[0] + "]" for level, m in shim_log.lines if level == "INFO" and "->" in m})
    print(
        "nrl-shim: "
        + (
            f"active; {len(changed)} fix(es) changed something here: {', '.join(changed)}"
            if shim_active
            else "not active"
        )
    )
    if not bad:
        worst = max(s["token_mult_prob_error"] for s in steps)
        print(f"VERDICT: OK — the rollouts come from the policy at every step (max token_mult_prob_error {worst:.3f}x)")
    else:
        first = bad[0]
        print(
            f"VERDICT: MISMATCH — step {first['step']} token_mult_prob_error {first['token_mult_prob_error']:.3g}x; measured:"
        )
        for cause in causes:
            print(f"  - {cause}")
        if not shim_active:
            print("  Run it under `nrl-shim run --` (the fixes: docs/rollout-parity.md, docs/refit.md).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "moe": args.moe,
                    "dtype": args.dtype,
                    "top_p": TOP_P,
                    "threshold": THRESHOLD,
                    "ok": not bad,
                    "causes": causes,
                    "checks": checks,
                    "steps": steps,
                },
                f,
                indent=1,
            )
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
