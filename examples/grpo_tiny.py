"""A tiny GRPO loop written the way RL frameworks write one today, with no import of nrl_shim: a policy trained with
torch, rollouts from a real vLLM engine (load_format="dummy", prefix caching on, vLLM's defaults otherwise), every
prompt behind one long shared system prompt, the policy's weights refit into the engine before every rollout,
sampling at temperature 0.7, and the engine's logprobs used in the loss (the PPO/GRPO ratio's "old" logprobs). It
reports NeMo RL's token_mult_prob_error per step: exp(mean |engine logprob - policy logprob|), 1.0 = the rollouts come
from the policy being trained.

    nrl-shim run -- python examples/grpo_tiny.py          # with the shim
    python examples/grpo_tiny.py                          # without
    python examples/grpo_tiny.py --moe                    # a mixture-of-experts policy (Qwen3-MoE)
    nrl-shim run -- python examples/grpo_tiny.py --engine sglang   # rollouts from SGLang's HTTP server

With --engine sglang the rollouts come from SGLang's HTTP server (`python -m sglang.launch_server` in a subprocess,
the checkpoint loaded, radix cache on), driven over HTTP as NeMo RL, slime, verl and AReaL drive it, refit the way
asynchronous RL refits SGLang: a long rollout is still generating when the new weights are ready (a partial rollout,
kept across the refit as AReaL and slime keep one), so generation is paused in place, the policy the trainer saved is
loaded with /update_weights_from_disk (SGLang flushes its radix cache after it, by default) and generation continues.
On a machine without a GPU SGLang needs its CPU platform (set here) and, from PyPI, the stand-ins of the test harness
on PYTHONPATH (tests/sglang_cpu/README.md): `PYTHONPATH=tests/sglang_cpu nrl-shim run -- python examples/grpo_tiny.py
--engine sglang`, with the interpreter of `nox -s sglang`'s venv.

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
logprobs are then renormalised over the kept tokens, the loss's are not), --engine vllm|sglang, --verbose (the
engine's own logs), --json PATH.
"""

import argparse
import contextlib
import json
import logging
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
import warnings

VOCAB = 512
SYSTEM_PROMPT = [random.Random(0).randrange(3, VOCAB) for _ in range(136)]  # longer than one KV block (CPU: 128)
QUESTIONS = [[5, 17, 42, 7], [100, 3, 9, 61], [11, 12, 13, 14], [300, 1, 2, 3]]  # same length: no padding to train
PROMPTS = [SYSTEM_PROMPT + question for question in QUESTIONS]
GROUP_SIZE = 8
NEW_TOKENS = 8
# --engine sglang: the rollout still generating at each refit (a partial rollout; ~3 s of decode on a CPU)
LONG_QUESTION = [400, 401, 402, 403]
LONG_TOKENS = 850  # with the 140-token prompt, within the model's 1024 positions
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
        max_position_embeddings=1024,  # --engine sglang: room for the long rollout (vLLM runs max_model_len=256)
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


class VllmEngine:
    """vLLM's offline engine in this process (`LLM`, engine core in-process: its model is reachable), refit with
    vLLM's own in-place reload."""

    docs = "docs/rollout-parity.md, docs/refit.md"

    def __init__(self, directory, dtype, verbose):
        # The engine core in this process (before vLLM is imported): quicker on a laptop, and its model is reachable.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # vLLM's CPU build: a fixed KV cache (GiB). Its default, a fraction of the memory node the process runs on,
        # minus what the process already holds, is below zero on a machine whose node 0 is small (8 GiB seen here).
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        say("starting vLLM with load_format='dummy', as RL frameworks do (~10-60 s on a CPU) ...")
        with native_stderr_kept_back(verbose):
            import vllm
            from vllm import LLM

        with native_stderr_kept_back(verbose):  # also the CPU build's NUMA binding notice at engine start
            self.llm = LLM(
                model=directory,
                load_format="dummy",
                skip_tokenizer_init=True,
                dtype=dtype,
                max_model_len=256,
                enforce_eager=True,
                enable_prefix_caching=True,
                gpu_memory_utilization=0.05,  # on GPUs; the CPU build takes VLLM_CPU_KVCACHE_SPACE
            )
        self.label = f"vLLM {vllm.__version__}"

    def rollout(self, seed):
        """GROUP_SIZE sampled completions per prompt, with vLLM's logprob of each sampled token and the prompt tokens
        it served from its prefix cache."""
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
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
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

    def model_runner(self):
        """The engine's model runner (engine core in this process)."""
        engine = self.llm.llm_engine
        executor = getattr(engine, "model_executor", None)
        if executor is None:
            executor = engine.engine_core.engine_core.model_executor
        worker = executor.driver_worker
        return getattr(worker, "worker", worker).model_runner

    def refit(self, policy):
        """Push the policy's weights into the engine in place, as RL frameworks do before each rollout."""
        runner = self.model_runner()
        weights = [(name, tensor.detach()) for name, tensor in policy.state_dict().items()]
        if hasattr(runner, "reload_weights"):
            runner.reload_weights(weights_iterator=weights)  # vLLM's in-place reload (re-laid-out layers included)
        else:
            runner.model.load_weights(weights=weights)  # what NeMo RL, verl and TRL call

    def reset_prefix_cache(self):
        self.llm.reset_prefix_cache()

    def shim_lines(self):
        return []  # the engine runs in this process: its lines are this process's

    def close(self):
        pass


class SglangServer:
    """SGLang's HTTP server (`python -m sglang.launch_server`) in a subprocess of its own session, driven over HTTP as
    NeMo RL, slime, verl and AReaL drive it. Its refit is the one of asynchronous RL on SGLang: a long rollout is still
    generating when the new weights are ready (a partial rollout, kept across the refit as AReaL and slime keep one),
    so generation is paused in place (SGLang keeps that rollout's KV), the policy saved by the trainer is loaded with
    /update_weights_from_disk (AReaL's route; SGLang flushes its radix cache after it, by default) and generation
    continues. The long rollout's tokens span two policies: the loss leaves them out."""

    START_TIMEOUT_S = 900
    docs = "docs/sglang.md"

    def __init__(self, directory, dtype, verbose):
        import torch

        self.directory = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "sglang.launch_server", "--model-path", directory, "--dtype", dtype]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--random-seed", "0"]
        command += [
            "--context-length",
            "1024",
            "--max-total-tokens",
            "8192",
            "--log-level",
            "info" if verbose else "error",
        ]
        env = dict(os.environ)
        if not torch.cuda.is_available():
            # SGLang's CPU platform: its own switch, and the options of its CPU path (PyTorch attention, no graphs).
            env["SGLANG_USE_CPU_ENGINE"] = "1"
            command += ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph"]
        self.log_path = os.path.join(directory, "sglang-server.log")
        self.log = open(self.log_path, "w")
        say(f"starting SGLang's HTTP server (~1-5 min on a CPU; its log: {self.log_path}) ...")
        self.proc = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        self.wait_ready()
        from importlib.metadata import version

        self.label = f"SGLang {version('sglang')}"
        self.said = set()
        self.long_rollouts = []

    def wait_ready(self):
        started = time.monotonic()
        while time.monotonic() - started < self.START_TIMEOUT_S:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang's server exited with {self.proc.poll()} while starting:\n{self.log_tail()}")
            with contextlib.suppress(urllib.error.URLError, OSError):
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            waited = time.monotonic() - started
            if waited > 1 and int(waited) % 30 == 0:
                say(f"... waiting for SGLang's server ({waited:.0f} s)")
            time.sleep(1)
        raise RuntimeError(f"SGLang's server was not up after {self.START_TIMEOUT_S} s:\n{self.log_tail()}")

    def log_tail(self, lines=20):
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def post(self, path, body, timeout=600):
        """(HTTP status, JSON body)."""
        data = json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                text = response.read().decode(errors="replace")
                with contextlib.suppress(ValueError):
                    return response.status, json.loads(text or "null")
                return response.status, text  # /flush_cache answers in plain text
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            with contextlib.suppress(ValueError):
                return error.code, json.loads(text)
            return error.code, text
        except (urllib.error.URLError, OSError) as error:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)  # a server going down drops the connection before it exits
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"SGLang's server died (exit code {code}); its log ends:\n{self.log_tail()}"
                ) from None
            raise RuntimeError(f"SGLang's server did not answer {path}: {error}") from None

    def sampling(self, max_new_tokens):
        return {"temperature": TEMPERATURE, "top_p": TOP_P, "max_new_tokens": max_new_tokens, "ignore_eos": True}

    def rollout(self, seed):
        """GROUP_SIZE sampled completions per prompt in one batch request (native /generate with token ids, as NeMo RL
        sends them), with SGLang's logprob of each sampled token and the prompt tokens it served from its radix cache.
        SGLang seeds a request only in its deterministic mode: `seed` is not used."""
        prompts = [prompt for prompt in PROMPTS for _ in range(GROUP_SIZE)]
        body = {"input_ids": prompts, "sampling_params": self.sampling(NEW_TOKENS), "return_logprob": True}
        status, outputs = self.post("/generate", body)
        if status != 200:
            raise RuntimeError(f"SGLang's /generate answered {status}: {outputs}")
        groups, cached = [], []
        for index, prompt in enumerate(PROMPTS):
            samples = []
            for output in outputs[index * GROUP_SIZE : (index + 1) * GROUP_SIZE]:
                meta = output["meta_info"]
                cached.append(int(meta.get("cached_tokens") or 0))
                entries = meta["output_token_logprobs"]  # (logprob, token id, text) per generated token
                tokens = [int(entry[1]) for entry in entries]
                samples.append({"prompt": prompt, "tokens": tokens, "logprobs": [float(entry[0]) for entry in entries]})
            groups.append(samples)
        while self.long_rollouts:  # the long rollout ends before the next refit (its tokens are not trained on)
            self.long_rollouts.pop().join(timeout=600)
        return groups, sum(cached) / len(cached)

    def start_long_rollout(self):
        """A rollout of LONG_TOKENS (streamed: its first token says it runs), left to finish in a thread."""
        body = {"input_ids": SYSTEM_PROMPT + LONG_QUESTION, "sampling_params": self.sampling(LONG_TOKENS)}
        request = urllib.request.Request(
            f"{self.url}/generate",
            data=json.dumps({**body, "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        response = urllib.request.urlopen(request, timeout=600)
        response.readline()  # the first streamed chunk: the request is running

        def drain():
            with response:
                for _line in response:
                    pass

        thread = threading.Thread(target=drain, daemon=True)
        thread.start()
        return thread

    def refit(self, policy):
        """The trainer saves the policy; SGLang loads it while a long rollout runs, paused in place (see the class)."""
        path = os.path.join(self.directory, "policy-now")
        policy.save_pretrained(path, safe_serialization=True)
        self.long_rollouts.append(self.start_long_rollout())
        self.post("/pause_generation", {"mode": "in_place"})
        try:
            status, out = self.post("/update_weights_from_disk", {"model_path": path})
        finally:
            self.post("/continue_generation", {})
        message = out.get("message", "") if isinstance(out, dict) else str(out)
        if status != 200 and message not in self.said:
            # What asynchronous loops do with it: the weights went in (SGLang says so), so the rollouts go on.
            self.said.add(message)
            say(f"SGLang's weight update answered {status}: {message!r}; going on")
        return status

    def reset_prefix_cache(self):
        self.post("/flush_cache", {})

    def shim_lines(self):
        """The shim's lines in the server's log (its fixes act in SGLang's processes)."""
        with open(self.log_path, errors="replace") as f:
            return [line.strip() for line in f if "nrl_shim" in line]

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)  # the server's own session: its scheduler and detokenizer go with it
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.log.close()


def free_port():
    """A free port well below 55535: SGLang derives more ports from its own (up to port + 10000)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 45000, 10)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-45000")


ENGINES = {"vllm": VllmEngine, "sglang": SglangServer}


def diagnose(engine, policy, seed):
    """Why the rollouts differ from the policy, measured: refit, sample the same requests with the prefix cache as it
    is and after a reset, and compare the engine's logprobs with the policy's at TEMPERATURE and at 1.0."""
    import torch

    engine.refit(policy)
    found = {}
    with torch.no_grad():
        for label in ("as cached", "after reset"):
            if label == "after reset":
                engine.reset_prefix_cache()
            groups, cached = engine.rollout(seed)
            served = engine_logprobs(groups)
            found[label] = {
                "cached": cached,
                "at_T": mult_prob_error(served, policy_logprobs(policy, groups, TEMPERATURE)),
                "at_1": mult_prob_error(served, policy_logprobs(policy, groups, 1.0)),
                "truncated": mult_prob_error(served, policy_logprobs(policy, groups, TEMPERATURE, TOP_P)),
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
    parser.add_argument(
        "--engine",
        choices=sorted(ENGINES),
        default="vllm",
        help="the rollout engine: vLLM's LLM in this process (default), or SGLang's HTTP server (a dense policy)",
    )
    parser.add_argument("--verbose", action="store_true", help="show the engine's and transformers' own logs")
    parser.add_argument("--json", metavar="PATH", help="write per-step numbers here")
    parser.add_argument("--top-p", type=float, default=1.0, help="sample with this top_p (default 1.0: off)")
    args = parser.parse_args()
    if args.engine == "sglang" and args.moe:
        parser.error("--moe: this example runs SGLang with a dense policy only (its MoE path was not run here)")
    global TOP_P
    TOP_P = args.top_p
    quiet_libraries(args.verbose)
    shim_log = ShimLog()
    logging.getLogger("nrl_shim").addHandler(shim_log)
    import torch

    kind = "Qwen3-MoE" if args.moe else "Llama"
    with tempfile.TemporaryDirectory(prefix="grpo-tiny-") as directory:
        say(f"writing a tiny {kind} policy to {directory} ...")
        policy = write_policy(directory, args.moe).train()
        optimizer = torch.optim.Adam(policy.parameters(), lr=LEARNING_RATE)
        engine = ENGINES[args.engine](directory, args.dtype, args.verbose)
        try:
            return run_steps(args, engine, policy, optimizer, shim_log)
        except RuntimeError as error:  # the engine failed under the job (SGLang's server died at a refit, ...)
            traceback.print_exc()  # what raised it, where (e.g. a strict-mode error of the shim), on stderr
            print(f"VERDICT: FAILED — {error}", flush=True)
            return 2
        finally:
            engine.close()


def run_steps(args, engine, policy, optimizer, shim_log):
    say(
        f"{engine.label} ({args.dtype}); GRPO: {len(PROMPTS)} prompts ({len(SYSTEM_PROMPT)}-token shared system prompt) x "
        f"{GROUP_SIZE} samples x {NEW_TOKENS} tokens at T={TEMPERATURE}"
        + (f", top_p={TOP_P}" if TOP_P < 1.0 else "")
        + ", a refit before each rollout"
    )
    print(f"{'step':>4}  {'reward':>6}  {'loss':>8}  {'cached/req':>10}  {'token_mult_prob_error':>21}", flush=True)
    steps, last_bad = [], None
    for step in range(args.steps):
        t0 = time.perf_counter()
        refit_status = engine.refit(policy)  # the policy's current weights into the engine, before its rollouts
        groups, cached = engine.rollout(seed=1000 + step)
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
                "refit_status": refit_status,  # SGLang: the update's HTTP status (400: applied, cache not flushed)
            }
        )
        print(f"{step:>4}  {mean_reward:>6.3f}  {loss:>8.4f}  {cached:>10.0f}  {error:>21.4f}", flush=True)
    bad = [s for s in steps if not s["token_mult_prob_error"] <= THRESHOLD]
    causes, checks = [], {}
    if last_bad is not None:
        # The check runs on the policy of the last step that mismatched (the one a stale prefix is furthest from).
        policy.load_state_dict(last_bad[1])
        causes, checks = diagnose(engine, policy, seed=1000 + last_bad[0])
    where = " and in the engine's processes" if engine.shim_lines() else ""
    shim_active = "nrl_shim" in sys.modules and sys.modules["nrl_shim"].is_active()
    # What the fixes changed here and, for an engine in other processes (SGLang's server), there (its log's INFO
    # lines of the shim, those saying "nothing to change" left out).
    engine_lines = [line.split("INFO: ", 1)[1] for line in engine.shim_lines() if "INFO: [" in line]
    lines = [m for level, m in shim_log.lines if level == "INFO" and "->" in m]
    lines += [m for m in engine_lines if "nothing to change" not in m]
    changed = sorted({m.split("]")[0] + "]" for m in lines if m.startswith("[")})
    print(
        "nrl-shim: "
        + (
            f"active; {len(changed)} fix(es) changed something here{where}: {', '.join(changed)}"
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
            print(f"  Run it under `nrl-shim run --` (the fixes: {engine.docs}).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "engine": args.engine,
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
