"""RayExecutorV2's steps 3-4 and its rank-0 worker's TCPStore, in one process, as on an engine spanning two nodes:
the executor picks the TCPStore port (`_select_tcpstore_port`), builds its broadcast MessageQueue with one local and
one remote reader (a TCP port from the VLLM_PORT scan, bound and held), then the TCPStore server binds the picked port.
VLLM_PORT comes from the environment; NRL_SHIM=1 activates the shim. Prints one JSON object."""

import json
import os
from datetime import timedelta

if os.environ.get("NRL_SHIM") == "1":
    import nrl_shim  # noqa: F401

from torch.distributed import TCPStore
from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
from vllm.v1.executor.ray_executor_v2 import RayExecutorV2

out = {"vllm_port": int(os.environ["VLLM_PORT"])}
out["plain_engine_port"] = RayExecutorV2._select_tcpstore_port(0, 0)  # what ParallelConfig hands a non-DP engine
port = out["tcpstore_port"] = RayExecutorV2._select_tcpstore_port(None, 0)
queue = MessageQueue(2, 1, connect_ip="127.0.0.1")
out["queue_address"] = queue.export_handle().remote_subscribe_addr
try:
    store = TCPStore("127.0.0.1", port, world_size=1, is_master=True, timeout=timedelta(seconds=10))
    store.set("ok", "1")
    out["tcpstore"] = "ok"
except Exception as error:
    out["tcpstore"] = f"{type(error).__name__}: {error}"
print(json.dumps(out))
