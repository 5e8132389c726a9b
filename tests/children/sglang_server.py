"""One real SGLang HTTP server (`python -m sglang.launch_server`, CPU) serving a list of cases in order, for the SGLang
fixes' tests (tests/sglang_runs.py): `python sglang_server.py RUN.json`, RUN = {"model_path": dir, "args": [extra
launch_server options], "cases": [...], "launch": "cli" | "spawn" | "ray_actor", "nemo_rl": bool}. Started with the
environment this program got (tests/sglang_cpu on PYTHONPATH, SGLANG_USE_CPU_ENGINE=1, the shim on or off as NRL_SHIM
says), as a job starts it; stopped at the end (its process group, which this program started).

Launch routes: `cli`, `python -m sglang.launch_server ARGS` in a subprocess; `ray_actor`, NeMo RL HEAD's way
(nemo_rl/models/generation/sglang/sglang_worker.py): a local Ray cluster (127.0.0.1) whose actor builds
`ServerArgs(**kwargs)` in Python and runs `launch_server(server_args)` in a `multiprocessing` spawn child, which starts
SGLang's scheduler and detokenizer processes; `spawn`, the same sequence in this process, without Ray. With "nemo_rl",
this process imports NeMo RL's package first (its source on PYTHONPATH), as NeMo RL's actor and driver have it; the
spawn child, as in NeMo RL, never does. The shim reaches each process through the environment alone.

Cases, each on the server as the cases before it left it (weights and radix cache included):
- {"kind": "generate", "prompt": ids, "max_tokens": n}: native /generate, greedy: tokens, logprobs, cached tokens;
- {"kind": "update_from_disk", "model_path": dir, "flush_cache": bool}: /update_weights_from_disk;
- {"kind": "post", "path": "/...", "body": {...}}: one POST of `body` (release/resume_memory_occupation): its status
  and answer;
- {"kind": "update_while_running", "model_path": dir, "requests": k, "prompt": ids, "max_tokens": n}: k requests
  started, the generation paused in place once they run (slime's and verl's way), /update_weights_from_disk with
  its flush (SGLang's default), generation continued, the k requests awaited;
- {"kind": "flush_while_running", "requests": k, "prompt": ids, "max_tokens": n}: k requests started, GET /flush_cache
  once they run (NeMo RL's invalidate_kv_cache), the k requests awaited: the flush's status and text;
- {"kind": "chat", "n": k, "body": {...}}: k /v1/chat/completions requests of `body`: their texts;
- {"kind": "sample", "prompt": ids, "max_tokens": n, "sampling": {...}}: native /generate sampled with those
  parameters (NeMo RL's request: input_ids, return_logprob): tokens and logprobs;
- {"kind": "batch", "requests": [{"prompt": ids, "max_tokens": n, "sampling": {...}}, ...]}: the requests sent at
  once (one batch), each one's tokens and logprobs;
- {"kind": "nemo_rl_update", "model_path": dir}: NeMo RL HEAD's refit of the checkpoint in `dir` (nemo_rl_update's
  docstring; NeMo RL's source on PYTHONPATH): {"ok": bool, "error": NeMo RL's error};
- {"kind": "group", "prompt": ids, "n": k, "max_tokens": n, "lead": bool}: k concurrent sampled requests of one prompt
  (a GRPO group; with `lead`, one first and the k-1 others once it is done; with `one_at_a_time`, each once the one
  before is done): their generated tokens, cached prompt
  tokens (the lead's first), how many distinct completions, and the wall time.
Prints one JSON line: SGLang's version, start time, per case its result and time, the server's exit code if it died,
and the server's log lines of the shim (`[<quirk id>]`).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

START_TIMEOUT_S = 900


def free_port():
    """A free port well below 55535: SGLang derives more ports from its own (0.5.12.post1 checks port + 10000 for its
    gRPC port and refuses the start above 65535), so a kernel-chosen ephemeral port may not do."""
    import random

    for _ in range(200):
        port = random.randrange(20000, 45000, 10)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-45000")


class Server:
    """`python -m sglang.launch_server` in a subprocess of its own session."""

    def __init__(self, model_path, args, log_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path, "--host", "127.0.0.1"]
        command += ["--port", str(self.port), *args]
        self.log = open(log_path, "w")
        # Its own session: the server's scheduler and detokenizer processes are stopped with it (our group only).
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def exit_code(self):
        """None while the server runs."""
        return self.proc.poll()

    def wait_ready(self):
        started = time.monotonic()
        while time.monotonic() - started < START_TIMEOUT_S:
            if self.exit_code() is not None:
                raise RuntimeError(f"the server exited with {self.exit_code()} while starting")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except (urllib.error.URLError, OSError):
                pass
            waited = time.monotonic() - started
            if int(waited) % 30 == 0:
                print(f"waiting for the SGLang server ({waited:.0f} s)", file=sys.stderr, flush=True)
            time.sleep(1)
        raise RuntimeError(f"the server was not up after {START_TIMEOUT_S} s")

    def post(self, path, body, timeout=600):
        """(HTTP status, JSON body, or its text where it is none: /flush_cache answers in words)."""
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, text = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read()
        try:
            return status, json.loads(text or b"null")
        except ValueError:
            return status, text.decode(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def _launch_in_actor(options, log_path):
    """In the Ray actor: NeMo RL's sequence (ServerArgs in Python, launch_server in a spawn child), the child's output to
    `log_path`. Returns the child's pid."""
    import multiprocessing

    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(**options)
    multiprocessing.set_start_method("spawn", force=True)
    if log_path is not None:
        log = open(log_path, "w")
        # The spawn child inherits these descriptors: its (and its scheduler's) log lines reach the file.
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    process = multiprocessing.Process(target=launch_server, args=(server_args,))
    process.start()
    return process


def kill_tree(process):
    """SIGKILL a multiprocessing child and every process under it (SGLang's scheduler and detokenizer), then reap it."""
    import psutil

    tree = [process.pid]
    try:
        tree += [c.pid for c in psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        pass
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.join(timeout=60)


class SpawnServer(Server):
    """launch_server(ServerArgs) in a `multiprocessing` spawn child of this process, as NeMo RL HEAD's actor starts it
    (nemo_rl/models/generation/sglang/sglang_worker.py `_launch_server_process`), without Ray."""

    def __init__(self, model_path, args, log_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "w")
        options = dict(model_path=model_path, host="127.0.0.1", port=self.port, **_options(args))
        # The child inherits descriptors 1 and 2 at its start: pointed at the log for that moment only, so that this
        # program's own result line still goes to its stdout.
        saved = os.dup(1), os.dup(2)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self.log.fileno(), 1)
        os.dup2(self.log.fileno(), 2)
        try:
            self.proc = _launch_in_actor(options, None)
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])

    def exit_code(self):
        return self.proc.exitcode

    def stop(self):
        kill_tree(self.proc)
        self.log.close()


class RayActorServer(Server):
    """launch_server(ServerArgs) in a spawn child of a Ray actor, as NeMo RL HEAD starts its SGLang servers."""

    def __init__(self, model_path, args, log_path):
        import ray

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.devnull, "w")  # the actor's child writes log_path itself
        options = dict(model_path=model_path, host="127.0.0.1", port=self.port, **_options(args))
        # Loopback only; the driver's environment (NRL_SHIM, the CPU harness) is the workers' (a local cluster).
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")

        @ray.remote(num_cpus=0)
        class SGLangServerActor:
            def start(self, options, log_path):
                self.process = _launch_in_actor(options, log_path)
                return self.process.pid

            def exit_code(self):
                return self.process.exitcode

            def stop(self):
                kill_tree(self.process)

        self.actor = SGLangServerActor.remote()
        self.pid = ray.get(self.actor.start.remote(options, log_path))

    def exit_code(self):
        import ray

        return ray.get(self.actor.exit_code.remote())

    def stop(self):
        import ray

        try:
            ray.get(self.actor.stop.remote(), timeout=120)
        finally:
            ray.shutdown()
            self.log.close()


def _options(args):
    """launch_server's command-line options as ServerArgs keyword arguments (`--a-b v` -> a_b="v", a flag -> True)."""
    options, index = {}, 0
    while index < len(args):
        key = args[index].removeprefix("--").replace("-", "_")
        if index + 1 < len(args) and not args[index + 1].startswith("--"):
            value = args[index + 1]
            index += 2
        else:
            value, index = True, index + 1
        options[key] = value
    for key, kind in (("context_length", int), ("max_total_tokens", int), ("random_seed", int)):
        if key in options:
            options[key] = kind(options[key])
    return options


def generate(server, case):
    sampling = case.get("sampling", {"temperature": 0.0})
    status, out = server.post(
        "/generate",
        {
            "input_ids": case["prompt"],
            "sampling_params": {**sampling, "max_new_tokens": case["max_tokens"], "ignore_eos": True},
            "return_logprob": case.get("logprobs", True),
        },
    )
    if status != 200:
        return {"status": status, "body": out}
    meta = out["meta_info"]
    if not case.get("logprobs", True):
        return {"status": status, "tokens": out["output_ids"], "cached": int(meta.get("cached_tokens") or 0)}
    entries = meta["output_token_logprobs"]  # (logprob, token id, text) per generated token
    return {
        "status": status,
        "tokens": [int(entry[1]) for entry in entries],
        "logprobs": [float(entry[0]) for entry in entries],
        "cached": int(meta.get("cached_tokens") or 0),
    }


def update_from_disk(server, case):
    status, out = server.post(
        "/update_weights_from_disk", {"model_path": case["model_path"], "flush_cache": case["flush_cache"]}
    )
    return {"status": status, "body": out}


def post(server, case):
    status, out = server.post(case["path"], case.get("body", {}))
    return {"status": status, "body": out}


def _while_running(server, case, during):
    """`case["requests"]` requests started, `during()` once they run, the requests awaited: (during's result, whether
    each request finished with all its tokens)."""
    results = [None] * case["requests"]

    prompts = case.get("prompts") or [case["prompt"]] * case["requests"]  # one each, or one for all

    def one(index):
        try:
            request = {
                "prompt": prompts[index],
                "max_tokens": case["max_tokens"],
                "logprobs": case.get("logprobs", True),
            }
            results[index] = generate(server, request)
        except Exception as error:  # the server died under it
            results[index] = {"error": repr(error)}

    threads = [threading.Thread(target=one, args=(i,)) for i in range(case["requests"])]
    for thread in threads:
        thread.start()
    time.sleep(case.get("settle_s", 1))  # the requests are admitted and decoding (each runs ~10 s here)
    outcome = during()
    for thread in threads:
        thread.join(timeout=600)
    finished = [r is not None and r.get("status") == 200 and len(r["tokens"]) == case["max_tokens"] for r in results]
    if case.get("outputs"):  # each request's tokens
        outcome = {**outcome, "outputs": [r.get("tokens") if r else None for r in results]}
    return outcome, finished


def update_while_running(server, case):
    def pause_update_continue():
        pause = server.post("/pause_generation", {"mode": "in_place"})
        try:
            update = server.post("/update_weights_from_disk", {"model_path": case["model_path"]})
        except Exception as error:
            update = (None, repr(error))
        try:
            resume = server.post("/continue_generation", {})
        except Exception as error:
            resume = (None, repr(error))
        return {"pause": list(pause), "update": {"status": update[0], "body": update[1]}, "continue": list(resume)}

    outcome, finished = _while_running(server, case, pause_update_continue)
    return {**outcome, "finished": finished}


def update_while_retracted(server, case):
    """The generation paused in SGLang's `retract` mode (running requests back to the waiting queue, their KV slots
    freed, their prompts' KV left in the radix cache), an update, the generation continued: each request prefills
    again (prompt and the tokens so far), its prompt served from the cache or recomputed: its later tokens say which
    (SGLang counts a request's cached tokens at its first prefill only). Greedy, no logprobs: 0.5.12.post1's CPU engine
    fails the input logprobs of such a prefill (`pin_memory=True` in the logits processor, a GPU-only allocation)."""

    def pause_update_continue():
        pause = server.post("/pause_generation", {"mode": "retract"})
        update = server.post(
            "/update_weights_from_disk", {"model_path": case["model_path"], "flush_cache": case["flush_cache"]}
        )
        resume = server.post("/continue_generation", {})
        return {"pause": list(pause), "update": {"status": update[0], "body": update[1]}, "continue": list(resume)}

    outcome, finished = _while_running(server, {**case, "outputs": True, "logprobs": False}, pause_update_continue)
    return {**outcome, "finished": finished}


def flush_while_running(server, case):
    """GET /flush_cache while the requests run, as NeMo RL's `invalidate_kv_cache` sends it (one GET; anything but a
    200 raises there) and its refit's retry loop (60 GETs a second apart, then TimeoutError): the first answer."""

    def flush():
        try:
            with urllib.request.urlopen(f"{server.url}/flush_cache", timeout=600) as response:
                return {"status": response.status, "text": response.read().decode(errors="replace")}
        except urllib.error.HTTPError as error:
            return {"status": error.code, "text": error.read().decode(errors="replace")}

    outcome, finished = _while_running(server, case, flush)
    return {"flush": outcome, "finished": finished}


def nemo_rl_update(server, case):
    """NeMo RL HEAD's own refit of its SGLang servers (nemo_rl.models.policy.utils.stream_weights_via_http_impl: the
    checkpoint's tensors in flattened buckets of NeMo RL's classes, POSTed to /update_weights_from_tensor with
    `load_format="flattened_bucket"`, `flush_cache=False`, then GET /flush_cache retried), from this process as NeMo
    RL's policy worker sends them. Its one CUDA call, `param.cuda()` (the bucket then goes by CUDA IPC), is a
    stand-in here returning the CPU tensor, which the same ForkingPickler then shares through shared memory: by file
    name (torch's `file_system` strategy), since SGLang's scheduler is no child of this process and may not fetch a
    file descriptor from it (multiprocessing's resource sharer checks the parent's authkey). The process group is
    real (gloo, one rank), as is everything else."""
    import torch
    import torch.distributed as dist
    from nemo_rl.models.policy.utils import stream_weights_via_http_impl
    from safetensors.torch import load_file

    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # stand-in for the CUDA copy (no GPU here)
    torch.multiprocessing.set_sharing_strategy("file_system")
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    weights = load_file(os.path.join(case["model_path"], "model.safetensors"))
    try:
        stream_weights_via_http_impl(
            params_generator=iter(sorted(weights.items())),
            rollout_engine_urls=[server.url],
            num_gpus_per_engine=1,
            rank=0,
            world_size=1,
            worker_name="policy",
            buffer_size_bytes=case.get("bucket_bytes", 1 << 19),  # several buckets for the tiny model
            worker_state={},
        )
    except Exception as error:  # NeMo RL's own error: the update failed
        return {"ok": False, "error": f"{type(error).__name__}: {error}"[:2000]}
    return {"ok": True}


def update_from_distributed(server, case):
    """A trainer's broadcast (update_weights_from_distributed, verl's and slime's route): this process is rank 0 of a
    weight-update group (gloo: SGLang takes the backend from the caller), the server's scheduler rank 1; the
    checkpoint's tensors broadcast one by one while SGLang's handler receives them, inside a weight-update session
    where the release has them (0.5.21+: SGLang refuses the update outside one)."""
    import datetime

    import torch.distributed as dist
    from safetensors.torch import load_file
    from sglang.srt.utils.common import init_custom_process_group

    weights = sorted(load_file(os.path.join(case["model_path"], "model.safetensors")).items())
    group_name, port, calls = "nrl-shim-test-weights", free_port(), {}

    def call(name, path, body):
        calls[name] = list(server.post(path, body))

    join = threading.Thread(
        target=call,
        args=("init", "/init_weights_update_group"),
        kwargs={
            "body": {
                "master_address": "127.0.0.1",
                "master_port": port,
                "rank_offset": 1,
                "world_size": 2,
                "group_name": group_name,
                "backend": "gloo",
            }
        },
    )
    join.start()
    group = init_custom_process_group(
        backend="gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        world_size=2,
        rank=0,
        group_name=group_name,
        timeout=datetime.timedelta(seconds=120),  # a server that never joins fails the case, not the run
    )
    join.join()
    session = server.post("/begin_weight_update", {})[0] == 200  # 404 before 0.5.21: no sessions
    body = {
        "names": [name for name, _ in weights],
        "dtypes": [str(tensor.dtype).removeprefix("torch.") for _, tensor in weights],
        "shapes": [list(tensor.shape) for _, tensor in weights],
        "group_name": group_name,
        "flush_cache": case["flush_cache"],
    }
    update = threading.Thread(target=call, args=("update", "/update_weights_from_distributed", body))
    update.start()
    for _, tensor in weights:
        dist.broadcast(tensor.contiguous(), src=0, group=group)
    update.join(timeout=600)
    if session:
        call("end", "/end_weight_update", {})
    call("destroy", "/destroy_weights_update_group", {"group_name": group_name})
    dist.destroy_process_group(group)
    return {"session": session, **calls}


def group(server, case):
    results = [None] * case["n"]
    sample = {"prompt": case["prompt"], "max_tokens": case["max_tokens"], "sampling": {"temperature": 1.0}}

    def one(index):
        results[index] = generate(server, sample)

    started = time.monotonic()
    first = 0
    if case.get("one_at_a_time"):  # each request once the one before is done (no batching between them)
        for index in range(case["n"]):
            one(index)
        first = case["n"]
    elif case.get("lead"):
        one(0)
        first = 1
    threads = [threading.Thread(target=one, args=(i,)) for i in range(first, case["n"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "seconds": time.monotonic() - started,
        "tokens": sum(len(r.get("tokens", ())) for r in results),
        "cached": [r.get("cached", 0) for r in results],
        "distinct": len({tuple(r.get("tokens", ())) for r in results}),
    }


def batch(server, case):
    """Requests sent together (one batch of the scheduler), each with its own sampling: each one's generate() result."""
    results = [None] * len(case["requests"])

    def one(index):
        results[index] = generate(server, case["requests"][index])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(results))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    return {"results": results}


def chat(server, case):
    texts = []
    for _ in range(case["n"]):
        status, out = server.post("/v1/chat/completions", case["body"])
        texts.append(out["choices"][0]["message"]["content"] if status == 200 else {"status": status, "body": out})
    return {"texts": texts}


CASES = {
    "generate": generate,
    "update_from_disk": update_from_disk,
    "post": post,
    "update_while_running": update_while_running,
    "update_while_retracted": update_while_retracted,
    "flush_while_running": flush_while_running,
    "chat": chat,
    "sample": generate,
    "group": group,
    "batch": batch,
    "nemo_rl_update": nemo_rl_update,
    "update_from_distributed": update_from_distributed,
}


def shim_lines(log_path):
    with open(log_path, errors="replace") as f:
        return [line.rstrip("\n") for line in f if "[sglang-" in line or "nrl_shim" in line]


def main():
    from importlib.metadata import version

    with open(sys.argv[1]) as f:
        run = json.load(f)
    log_path = sys.argv[1] + ".server.log"
    if run.get("nemo_rl"):  # the launching process is a NeMo RL process (its package imported, as its actor has it)
        import nemo_rl  # noqa: F401

    route = {"cli": Server, "spawn": SpawnServer, "ray_actor": RayActorServer}[run.get("launch", "cli")]
    server = route(run["model_path"], run.get("args", []), log_path)
    results, died, start_s = [], None, None
    try:
        start_s = server.wait_ready()
        for case in run["cases"]:
            t0 = time.monotonic()
            if server.exit_code() is not None:
                results.append({"result": {"error": "server not running"}, "seconds": 0.0})
                continue
            try:
                result = CASES[case["kind"]](server, case)
            except Exception as error:
                result = {"error": repr(error)}
            results.append({"result": result, "seconds": time.monotonic() - t0})
    finally:
        died = server.exit_code()
        server.stop()
    with open(log_path, errors="replace") as f:
        tail = f.read()[-4000:]
    print(
        json.dumps(
            {
                "sglang": version("sglang"),
                "start_s": start_s,
                "cases": results,
                "died": died,
                "shim_lines": shim_lines(log_path),
                "log_tail": tail,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
