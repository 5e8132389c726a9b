"""N processes build vLLM's MessageQueue with a remote reader at the same instant, ROUNDS times:
`python mq_bind_race.py N ROUNDS`. VLLM_PORT comes from the environment. Prints one JSON object: per round, per
process, "ok" and the port its handle advertises and the one its socket is bound to, or the error. NRL_SHIM=1 in the
environment: each process activates the shim (as a worker with the .pth would).

The processes are forked by a forkserver that imported vLLM's shm_broadcast once (a fresh interpreter, started with
this environment: the .pth activates the shim there under NRL_SHIM=1): spawning N interpreters that each import torch
and vLLM takes minutes on 2 cores; the race is the same."""

import json
import multiprocessing as mp
import os
import sys


def worker(index, rounds, start, built, results):
    if os.environ.get("NRL_SHIM") == "1":
        import nrl_shim  # noqa: F401  (the .pth does the same at start-up; idempotent)
    import zmq
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    for round_ in range(rounds):
        start.wait()  # all processes released together, as init_device()'s collective releases vLLM's workers
        queue = None
        try:
            queue = MessageQueue(n_reader=1, n_local_reader=0, connect_ip="127.0.0.1")
            advertised = queue.export_handle().remote_subscribe_addr
            bound = queue.remote_socket.getsockopt(zmq.LAST_ENDPOINT).decode()
            results.put([round_, index, "ok", advertised, bound])
        except Exception as error:
            results.put([round_, index, "error", f"{type(error).__name__}: {error}", None])
        built.wait()  # every queue is held until all were built, so each sees the ports the others took
        if queue is not None and queue.remote_socket is not None:
            queue.remote_socket.close(linger=0)


def main():
    processes, rounds = int(sys.argv[1]), int(sys.argv[2])
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["vllm.distributed.device_communicators.shm_broadcast"])
    start, built, results = context.Barrier(processes), context.Barrier(processes), context.Queue()
    workers = [context.Process(target=worker, args=(i, rounds, start, built, results)) for i in range(processes)]
    for process in workers:
        process.start()
    out = [results.get(timeout=600) for _ in range(processes * rounds)]
    for process in workers:
        process.join(timeout=60)
    print(json.dumps({"vllm_port": os.environ.get("VLLM_PORT"), "results": sorted(out)}))


if __name__ == "__main__":
    main()
