"""GPU check of vllm-gemma-load-format: Gemma-3 with load_format="dummy" + a weight refit, with and without the shim.

For each Python given (one venv per vLLM release, e.g. 0.9.0 = affected, 0.33.0 = fixed):
  1. a tiny random-weight Gemma-3 (gemma3_text) is saved locally with that venv's transformers (no download);
  2. transformers' greedy continuation of a fixed token prompt is the reference;
  3. vLLM starts with load_format="dummy", then every HF weight is refit into it (as an RL trainer does; the HF
     state dict has no `normalizer` buffer), then generates greedily - once with NRL_SHIM=1, once with NRL_SHIM=0,
     each in its own process.
Expected (greedy tokens of 16 prompts, >= 90% equal to transformers' counts as a match): on vLLM < 0.9.2 without
the shim the output differs (the persistent normalizer buffer stays random: the bug); with the shim (dummy -> auto)
it matches. On fixed releases both match.

    python gpu/vllm_gemma_dummy.py --pythons /venvs/vllm-0.9.0/bin/python,/venvs/vllm-0.33.0/bin/python
Exit 0 when every expectation holds; one JSON line per run, then a table. ~1-2 min per vLLM start on an H100/H200.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_TOKENS = 4
MATCH_THRESHOLD = 0.9  # float32 on both sides: near-ties may still flip a token now and then
# 16 fixed prompts: a random tiny model's greedy text collapses into repeats, many prompts do not.
PROMPTS = [[2] + [(37 * i + 101 * j) % 500 + 3 for j in range(9)] for i in range(16)]


def make_model(path):
    """Tiny random Gemma-3 text model, float32, saved as safetensors; returns transformers' greedy token ids."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=512,
        sliding_window=128,
        torch_dtype="float32",
    )
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # layers strong against the (tied) embedding, so the model does not just echo its input
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.02 if "embed" in name else 0.3)
    model.save_pretrained(path, safe_serialization=True)
    with torch.no_grad():
        out = model.generate(torch.tensor(PROMPTS), max_new_tokens=MAX_TOKENS, do_sample=False, top_k=None, top_p=None)
    return out[:, len(PROMPTS[0]) :].tolist()


def run_vllm(path):
    """vLLM: dummy weights, refit from the saved HF weights, greedy generation. Returns the token ids."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: refit via apply_model
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=path,
        load_format="dummy",
        dtype="float32",
        enforce_eager=True,
        skip_tokenizer_init=True,
        gpu_memory_utilization=0.3,
        max_model_len=256,
        seed=0,
    )
    load_format = str(getattr(llm.llm_engine.vllm_config.load_config, "load_format", "?"))

    def refit(model):
        from safetensors.torch import load_file

        weights = load_file(os.path.join(path, "model.safetensors"))
        model.load_weights(weights.items())  # what an RL refit sends: HF parameters only, never `normalizer`

    llm.apply_model(refit)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], load_format


def child(mode, path):
    if mode == "model":
        print(json.dumps({"reference": make_model(path)}))
        return
    if mode == "shim":
        import nrl_shim  # noqa: F401  (NRL_SHIM=1 in the environment: active)
    tokens, load_format = run_vllm(path)
    from importlib.metadata import version

    print(json.dumps({"vllm": version("vllm"), "tokens": tokens, "effective_load_format": load_format}))


def _run(python, mode, path, shim):
    env = dict(os.environ, NRL_SHIM="1" if shim else "0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [python, os.path.abspath(__file__), "--child", mode, path], env=env, capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise SystemExit(f"{python} --child {mode} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pythons", default=sys.executable, help="comma list of interpreters (one per vLLM venv)")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)
    from packaging.version import Version

    rows, ok = [], True
    for python in args.pythons.split(","):
        with tempfile.TemporaryDirectory(prefix="tiny-gemma3-") as path:
            reference = _run(python, "model", path, shim=False)["reference"]
            for shim in (True, False):
                result = _run(python, "shim" if shim else "plain", path, shim)
                affected = Version(result["vllm"]) < Version("0.9.2")
                pairs = [(a, b) for got, ref in zip(result["tokens"], reference) for a, b in zip(got, ref)]
                match_rate = sum(a == b for a, b in pairs) / len(reference) / MAX_TOKENS
                matches = match_rate >= MATCH_THRESHOLD
                expected = matches if (shim or not affected) else not matches
                ok &= expected
                row = dict(
                    result,
                    shim=shim,
                    affected=affected,
                    match_rate=round(match_rate, 3),
                    matches_transformers=matches,
                    as_expected=expected,
                    reference=reference,
                    python=python,
                )
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(f"\n{'vLLM':<10} {'shim':<5} {'load_format':<12} {'tokens = HF':<12} expected")
    for r in rows:
        print(
            f"{r['vllm']:<10} {str(r['shim']):<5} {r['effective_load_format']:<12} {r['match_rate']:<12.0%} "
            f"{'yes' if r['as_expected'] else 'NO'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
