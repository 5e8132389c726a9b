"""Shared by the tests of NeMo RL HEAD's vLLM file rewrites done in memory (vllm-mq-bind-retry,
vllm-ray-tcpstore-port, vllm-openai-namespace-tool): the installed vLLM, a free port band, and a copy of vLLM that
NeMo RL's patch functions may rewrite (never the venv's own files)."""

import os
import random
import shutil
import socket
import subprocess
from pathlib import Path

from nemo_rl_helpers import nemo_rl_source

from nrl_shim.libraries import find

VLLM = find("vllm")
VLLM_VERSION = VLLM.version
NEMO_RL_COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
NEMO_RL, NO_NEMO_RL = nemo_rl_source(
    NEMO_RL_COMMIT, "NRL_SHIM_NEMO_RL_7EA279ABF", "nemo_rl/models/generation/vllm/patches.py"
)


def nemo_rl_unusable():
    """Why NeMo RL HEAD's patches module can't be imported with this interpreter's libraries (e.g. transformers <4.52
    beside vLLM 0.8.5: no transformers.video_utils), as its last error line; None where it imports. Asked once."""
    if "unusable" not in _NEMO_RL_IMPORT:
        import sys

        environ = {k: v for k, v in os.environ.items() if not k.startswith("NRL_")}
        environ.update({"NRL_SHIM": "0", "PYTHONPATH": NEMO_RL})
        code = "from nemo_rl.models.generation.vllm import patches"
        proc = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=300)
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        why = f"NeMo RL {NEMO_RL_COMMIT[:9]} does not import here: {last}"
        _NEMO_RL_IMPORT["unusable"] = None if proc.returncode == 0 else why
    return _NEMO_RL_IMPORT["unusable"]


_NEMO_RL_IMPORT: dict = {}


def affected(specifier):
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return VLLM_VERSION is not None and Version(VLLM_VERSION) in SpecifierSet(specifier)


def free_band(width=128):
    """A VLLM_PORT whose next `width` ports are free now."""
    for _ in range(50):
        base = random.randrange(20000, 30000)
        try:
            probes = []
            for port in range(base, base + width):
                s = socket.socket()
                probes.append(s)
                s.bind(("", port))
        except OSError:
            continue
        finally:
            for s in probes:
                s.close()
        return base
    raise AssertionError("no free band of ports found")


def vllm_dir():
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    return Path(next(iter(spec.submodule_search_locations)))


def vllm_copy(root, rewritable):
    """<root>/vllm: a tree of symlinks to the installed vLLM's files, except `rewritable` (paths under vllm/), which are
    real copies: NeMo RL's patch functions (they find vLLM through find_spec, i.e. PYTHONPATH first) rewrite those
    copies, never the venv's files. Returns the directory to put first on PYTHONPATH."""
    source, target = vllm_dir(), Path(root) / "vllm"
    shutil.copytree(source, target, copy_function=os.symlink, ignore=shutil.ignore_patterns("__pycache__"))
    for relative in rewritable:
        path = target / relative
        path.unlink()
        shutil.copyfile(source / relative, path)
    return str(root)


def nemo_rl_patch_code(function):
    """Python source that runs NeMo RL HEAD's `patches.<function>(logger)`, its log lines on stderr."""
    return (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, format='%(name)s %(levelname)s: %(message)s')\n"
        "from nemo_rl.models.generation.vllm import patches\n"
        f"patches.{function}(logging.getLogger('vllm_patch'))\n"
    )


def nemo_rl_patch_read_only(function):
    """NeMo RL HEAD's `patches.<function>` with the installed vLLM mounted read-only; asserts it fails for that."""
    import sys

    from conftest import child_env

    env = child_env({"NRL_SHIM": "0", "PYTHONPATH": f"{NEMO_RL}:{child_env()['PYTHONPATH']}"})
    argv = read_only([sys.executable, "-c", nemo_rl_patch_code(function)], vllm_dir())
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    # NeMo RL's rewrite needs a writable vLLM: it must fail there, saying why.
    assert proc.returncode != 0 and "Read-only file system" in proc.stderr, proc.stderr[-3000:]
    print("NeMo RL on a read-only site-packages:", proc.stderr.strip().splitlines()[-1])
    return proc


def nemo_rl_patch(function, pythonpath, env=None):
    """Run NeMo RL HEAD's `patches.<function>(logger)` in a fresh interpreter whose vLLM is the one found first on
    `pythonpath`; return its CompletedProcess (its log lines are on stderr)."""
    code = nemo_rl_patch_code(function)
    import sys

    environ = {k: v for k, v in os.environ.items() if not k.startswith("NRL_")}
    environ.update({"NRL_SHIM": "0", "PYTHONPATH": os.pathsep.join([pythonpath, NEMO_RL]), **(env or {})})
    return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=300)


def can_mount_read_only():
    """`unshare -m` + a read-only bind mount: site-packages read-only for one child, even for root."""
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            "mount --bind /tmp /tmp && mount -o remount,bind,ro /tmp && ! touch /tmp/.nrl-ro",
        ],
        capture_output=True,
    )
    return probe.returncode == 0


def read_only(argv, directory):
    """argv run with `directory` mounted read-only (a private mount namespace: nothing else sees it)."""
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, str(directory), *argv]
