"""GPU check of sglang-weightless-resume-guard with the real torch_memory_saver (the CPU tests use a stand-in).

For each Python given (one venv per SGLang release, with `torch-memory-saver` installed):
  1. a tiny random Llama is saved locally (no download);
  2. an `sglang.Engine(enable_memory_saver=True)` (no `enable_weights_cpu_backup`) generates a fixed prompt greedily,
     then release_memory_occupation(), resume_memory_occupation(), the same prompt (before any refit), the refit
     (update_weights_from_disk of the same checkpoint), the same prompt again - once with NRL_SHIM=0, once with
     NRL_SHIM=1, once with NRL_SHIM=1 NRL_SHIM_STRICT=1, each in its own process.
Expected: after the refit every run gives the first output again. Before it: without the shim no line of the guard
(the output is reported: it comes from whatever the fresh memory holds, so it may by chance equal the first); with
the shim one WARNING of the guard; in strict mode the request is aborted with the guard's error and the engine goes on.

    python gpu/sglang_weightless_resume.py --pythons /venvs/sglang-0.5.12.post1/bin/python,/venvs/sglang-0.5.23/bin/python
Exit 0 when every expectation holds; one JSON line per run. ~1 min per engine start on an H100.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ID = "sglang-weightless-resume-guard"
PROMPT = [1] + [(i * 37) % 500 + 3 for i in range(63)]
MAX_TOKENS = 8

CHILD = r"""
import json, sys
import sglang

path = sys.argv[1]
prompt, max_tokens = json.loads(sys.argv[2])
engine = sglang.Engine(model_path=path, enable_memory_saver=True, mem_fraction_static=0.3, random_seed=0, log_level="info")
params = {"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True}

def ask():
    try:
        out = engine.generate(input_ids=prompt, sampling_params=params)
        return {"tokens": out.get("output_ids"), "finish": str(out["meta_info"].get("finish_reason"))}
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}

result = {"first": ask()}
engine.release_memory_occupation()
engine.resume_memory_occupation()
result["after_resume"] = ask()
engine.update_weights_from_disk(path)
result["after_refit"] = ask()
engine.shutdown()
print("RESULT " + json.dumps(result), flush=True)
"""


def make_model(python, path):
    code = (
        "import sys, torch\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "torch.manual_seed(0)\n"
        "config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,"
        " num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, torch_dtype='bfloat16')\n"
        "LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1], safe_serialization=True)\n"
    )
    subprocess.run([python, "-c", code, path], check=True)


def run(python, path, env_extra):
    env = {**os.environ, "PYTHONPATH": ROOT, "NRL_SHIM_LOG_LEVEL": "INFO", **env_extra}
    proc = subprocess.run(
        [python, "-c", CHILD, path, json.dumps([PROMPT, MAX_TOKENS])], env=env, capture_output=True, text=True
    )
    lines = (proc.stdout + proc.stderr).splitlines()
    results = [json.loads(line[7:]) for line in lines if line.startswith("RESULT ")]
    guard = [line for line in lines if f"[{ID}]" in line]
    return {"rc": proc.returncode, "results": results[0] if results else None, "guard": guard, "tail": lines[-20:]}


def check(setting, out):
    results = out["results"]
    if not results or out["rc"] != 0:
        return False
    ok = results["after_refit"].get("tokens") == results["first"].get("tokens")
    if setting == "plain":
        return ok and not out["guard"]
    if setting == "shim":
        return ok and sum("WARNING" in line for line in out["guard"]) == 1
    return ok and ID in str(results["after_resume"])  # strict: the abort's message


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pythons", required=True, help="comma list of Python executables, one per SGLang release")
    args = parser.parse_args()
    settings = {
        "plain": {"NRL_SHIM": "0"},
        "shim": {"NRL_SHIM": "1"},
        "strict": {"NRL_SHIM": "1", "NRL_SHIM_STRICT": "1"},
    }
    failed = 0
    for python in args.pythons.split(","):
        path = tempfile.mkdtemp(prefix="nrl-shim-gpu-llama-")
        make_model(python, path)
        for setting, env_extra in settings.items():
            print(f"{python}: {setting} ...", file=sys.stderr, flush=True)
            out = run(python, path, env_extra)
            ok = check(setting, out)
            failed += not ok
            print(json.dumps({"python": python, "setting": setting, "ok": ok, **out}), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
