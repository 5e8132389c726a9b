"""Regression matrix: one session per pinned vLLM release, each in its own venv with that release's own torch pin.

Venvs live outside the repo (NRL_SHIM_VENV_CACHE, default ~/.cache/nrl-shim/nox) and are reused between runs;
uv's hard-linked cache keeps one copy of each wheel on disk. A fresh machine builds them on first use.
"""

import os
from pathlib import Path

import nox

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
CI_RELEASES = ["0.10.1.1", "0.33.0"]


def _install(session: nox.Session, vllm: str) -> None:
    session.install(f"vllm=={vllm}", VLLM_RELEASES[vllm], "ray", "pytest>=8", "hypothesis>=6")
    # Not editable: the wheel puts nrl_shim.pth in site-packages, which the activation tests rely on.
    # --compile-bytecode as pip does by default (uv doesn't): start-up cost is measured against installed .pyc files.
    session.install("--compile-bytecode", "--reinstall-package", "nrl-shim", ".")


@nox.session(python="3.11")
@nox.parametrize("vllm", [nox.param(v, tags=["ci"] if v in CI_RELEASES else []) for v in VLLM_RELEASES])
def matrix(session: nox.Session, vllm: str) -> None:
    """Whole test suite against one pinned vLLM release."""
    _install(session, vllm)
    session.run("python", "-m", "pytest", *(session.posargs or ["-q", "tests"]))
