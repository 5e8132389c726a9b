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
- {"kind": "settle", "seconds": s}: nothing for s seconds (the scheduler finishes what it answered already);
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

import contextlib
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


@contextlib.contextmanager
def outputs_to(log):
    """Descriptors 1 and 2 pointed at `log` for the block only: a child started inside inherits them (its and its
    scheduler's lines reach the log) while this program's own result line still goes to its stdout."""
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


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
        with outputs_to(self.log):  # the child inherits them at its start
            self.proc = _launch_in_actor(options, None)

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


class _CpuAccelerator:
    """Made on first use (slime's accelerator base class is imported with slime): a CPU backend for slime's
    accelerator registry (its own extension point, `register_accelerator`), which slime's SGLangEngine asks for the
    device ids it gives SGLang. Slime ships CUDA and MUSA backends only; nothing of it is changed."""

    @staticmethod
    def register():
        from slime.utils import accelerator
        from slime.utils.accelerator.base import Accelerator

        def unused(self, *args, **kwargs):
            raise NotImplementedError("not used by slime's SGLang engine")

        methods = {name: unused for name in getattr(Accelerator, "__abstractmethods__", ())}
        cpu = type(
            "CpuAccelerator",
            (Accelerator,),
            {
                **methods,
                "name": "cpu",
                "device_type": "cpu",
                "communication_backend_name": "gloo",
                "visible_devices_env": "NRL_SHIM_TEST_VISIBLE_CPUS",
                "is_available": lambda self: True,
            },
        )
        accelerator.register_accelerator("cpu", cpu, is_available=lambda: True, communication_backends=("gloo",))
        os.environ["SLIME_ACCELERATOR"] = "cpu"


class SlimeServer(Server):
    """slime's own SGLangEngine (slime/backends/sglang_utils/sglang_engine.py, its source on sys.path, unmodified):
    its ServerArgs from slime's arguments (`--sglang-<option>` as attributes `sglang_<option>`, what slime's parser
    makes of them), `launch_server` in a `multiprocessing` spawn child of this process, as slime's Ray actor starts
    it. Its engine methods (pause, flush, updates, continue) are the slime cases' calls."""

    def __init__(self, model_path, args, log_path, source):
        import multiprocessing
        import types

        sys.path.insert(0, source)
        _CpuAccelerator.register()
        from slime.backends.sglang_utils.sglang_engine import SGLangEngine

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "w")
        slime_args = types.SimpleNamespace(
            hf_checkpoint=model_path,
            seed=0,
            offload_rollout=True,  # colocated training: slime's memory saver, as in sglang_runs' other routes
            num_gpus_per_node=1,
            rollout_num_gpus_per_engine=1,
            colocate=True,
            debug_rollout_only=False,
            actor_num_gpus_per_node=1,
            actor_num_nodes=1,
            sglang_pp_size=1,
            sglang_dp_size=1,
            sglang_ep_size=1,
            use_rollout_routing_replay=False,
            fp16=False,
            rollout_external=False,
            sglang_router_ip=None,  # no router: the engine is reached directly
            sglang_router_port=None,
            **{f"sglang_{key}": value for key, value in _options(args).items()},
        )
        self.engine = SGLangEngine(slime_args, rank=0)
        # slime's init starts the server and waits for /health_generate: in a thread, so that this program's progress
        # lines go on; the spawn child's descriptors point at the log until it has started.
        self.init_error = None

        def init():
            try:
                self.engine.init(
                    dist_init_addr=f"127.0.0.1:{free_port()}", port=self.port, nccl_port=free_port(), host="127.0.0.1"
                )
            except Exception as error:
                self.init_error = repr(error)

        self.starting = threading.Thread(target=init, daemon=True)
        with outputs_to(self.log):
            self.starting.start()
            deadline = time.monotonic() + 120
            while not multiprocessing.active_children() and self.starting.is_alive() and time.monotonic() < deadline:
                time.sleep(0.1)

    def _process(self):
        import multiprocessing

        children = multiprocessing.active_children()
        return getattr(self.engine, "process", None) or (children[0] if children else None)

    def exit_code(self):
        if self.init_error is not None:
            return self.init_error
        process = self._process()
        return None if process is None else process.exitcode

    def wait_ready(self):
        started = super().wait_ready()
        self.starting.join(timeout=START_TIMEOUT_S)  # slime's own wait (/health_generate) done too
        if self.init_error is not None:
            raise RuntimeError(f"slime's engine init failed: {self.init_error}")
        return started

    def stop(self):
        process = self._process()
        if process is not None:
            kill_tree(process)
        self.log.close()


class ArealServer(Server):
    """AReaL's own SGLang server (AReaL 1.0.4, installed): launch_server's options mapped onto AReaL's SGLangConfig
    and its `build_args` (the rest, the CPU engine's options, added as they are), the command AReaL's SGLangBackend
    starts (`python3 -m areal.experimental.inference_service.sglang.launch_server`: AReaL's copy of SGLang's
    launch_server with its own scheduler process function); then AReaL's RemoteSGLangEngine connected to it, whose
    methods the AReaL cases call."""

    def __init__(self, model_path, args, log_path, areal_config=None):
        import dataclasses as dc

        from areal.api.cli_args import SGLangConfig
        from areal.engine.sglang_remote import SGLangBackend

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "w")
        self.engine = None
        options = _options(args)
        fields = {f.name for f in dc.fields(SGLangConfig)}
        # AReaL's own settings where the run names them (areal_config), its defaults otherwise
        config = SGLangConfig(
            model_path=model_path, **{k: v for k, v in options.items() if k in fields}, **(areal_config or {})
        )
        server_args = SGLangConfig.build_args(config, tp_size=1, base_gpu_id=0, host="127.0.0.1", port=self.port)
        server_args.update({k: v for k, v in options.items() if k not in fields})
        # AReaL's command is `python3 -m ...`: this interpreter's, as in AReaL's own environment
        os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        with outputs_to(self.log):  # AReaL's Popen writes the server's output to this program's stdout
            self.proc = SGLangBackend().launch_server(server_args)

    def wait_ready(self):
        import tempfile as tf

        from areal.api.cli_args import InferenceEngineConfig, NameResolveConfig
        from areal.engine.sglang_remote import RemoteSGLangEngine
        from areal.utils import name_resolve

        started = super().wait_ready()
        # AReaL's disk refit waits for the trainer's record in name_resolve: a record root of this run's own
        name_resolve.reconfigure(NameResolveConfig(type="nfs", nfs_record_root=tf.mkdtemp(prefix="areal-names-")))
        config = InferenceEngineConfig(
            experiment_name="nrl-shim-test", trial_name="areal", backend="sglang:d1", setup_timeout=600
        )
        self.engine = RemoteSGLangEngine(config)
        self.engine.initialize(addr=[f"127.0.0.1:{self.port}"], train_data_parallel_size=1)
        return started

    def stop(self):
        if self.engine is not None:
            try:
                self.engine.destroy()
            except Exception as error:  # the run's result stands; say why the engine did not close
                print(f"AReaL engine destroy: {error!r}", file=sys.stderr)
        import psutil

        tree = [self.proc.pid]
        try:
            tree += [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=60)
        self.log.close()


def areal_update(server, case):
    """AReaL's refit as its FSDP engine runs it (areal/engine/fsdp_engine.py `_update_weights_from_distributed`,
    `_update_weights_from_disk`), through AReaL's RemoteSGLangEngine, while `requests` rollouts run through its
    `agenerate` (AReaL's interruption loop: an aborted request is sent again with its tokens so far once the engine
    continues): pause_generation (SGLang's abort, then AReaL's grace period); "xccl": the weight-update group joined
    and update_weights_from_distributed while the trainer (this process) broadcasts over gloo (AReaL's CPU platform);
    "disk": update_weights_from_disk once the trainer's record is in name_resolve; the version set, continue. Each
    rollout's tokens, the version of each token, its stop reason."""
    import asyncio
    import datetime as dt

    from areal.api.alloc_mode import ModelAllocation
    from areal.api.cli_args import GenerationHyperparameters
    from areal.api.io_struct import ModelRequest, ParamSpec, WeightUpdateMeta
    from areal.utils import name_resolve, names

    engine = server.engine
    version = engine.get_version()
    results = [None] * case["requests"]

    async def rollouts():
        gconfig = GenerationHyperparameters(
            n_samples=1, max_new_tokens=case["max_tokens"], max_tokens=len(case["prompt"]) + case["max_tokens"] + 1,
            greedy=True, ignore_eos=True,
        )  # fmt: skip

        async def one(index):
            try:
                response = await engine.agenerate(ModelRequest(input_ids=list(case["prompt"]), gconfig=gconfig))
                results[index] = {
                    "tokens": list(response.output_tokens),
                    "versions": list(response.output_versions),
                    "stop": response.stop_reason,
                }
            except Exception as error:
                results[index] = {"error": f"{type(error).__name__}: {error}"[:2000]}

        await asyncio.gather(*(one(i) for i in range(case["requests"])))

    running = threading.Thread(target=lambda: asyncio.run(rollouts()))
    running.start()
    time.sleep(case.get("settle_s", 2))  # the rollouts are admitted and decoding
    steps = {}
    try:
        engine.pause_generation()
        if case["route"] == "xccl":
            meta = WeightUpdateMeta(
                type="xccl",
                gen_allocation=ModelAllocation.from_str("sglang:d1", name="rollout"),
                nccl_master_address="127.0.0.1",
                nccl_group_name="update_weight_group",
            )

            def join(port, group_name):
                meta.nccl_master_port, meta.nccl_group_name = port, group_name
                return engine.init_weights_update_group(meta).result(timeout=300)

            def update(body):
                specs = [
                    ParamSpec(name=n, shape=tuple(sh), dtype=d)
                    for n, d, sh in zip(body["names"], body["dtypes"], body["shapes"])
                ]
                return engine.update_weights_from_distributed(meta, specs).result(timeout=600)

            calls = _broadcast_update(case["model_path"], None, join, update)
            steps["update"] = calls
        else:
            meta = WeightUpdateMeta(type="disk", path=case["model_path"], clear_checkpoint_after_load=False)
            future = engine.update_weights_from_disk(meta)
            update_name = names.update_weights_from_disk("nrl-shim-test", "areal", version)
            name_resolve.add(update_name, str(dt.datetime.now().timestamp()), keepalive_ttl=120)
            future.result(timeout=600)
            steps["update"] = {"ok": True}
        engine.set_version(version + 1)
        engine.continue_generation()
    except Exception as error:
        steps["error"] = f"{type(error).__name__}: {error}"[:2000]
        try:
            engine.continue_generation()
        except Exception:
            pass
    running.join(timeout=900)
    return {**steps, "rollouts": results}


def slime_update(server, case):
    """slime's refit (slime/ray/actor_group.py `_reload_rollout_weights_from_disk` for "disk", its
    UpdateWeightFromDistributed.update_weights for "distributed"), through slime's own engine methods, while
    `requests` rollouts run: pause_generation (SGLang's default mode, abort), flush_cache (slime's loop: 60 GETs a
    second apart until a 200, then TimeoutError), the update with the next weight version, continue_generation; then
    the weight version the engine reports. Each call's answer or error; each rollout's tokens and finish reason."""
    engine = server.engine
    version = str(case["weight_version"])

    def call(action, *args, **kwargs):
        t0 = time.monotonic()
        try:
            answer = action(*args, **kwargs)
            answer = getattr(answer, "status_code", answer)  # pause/continue return the requests Response
            return {"ok": True, "answer": answer, "seconds": round(time.monotonic() - t0, 2)}
        except Exception as error:
            return {"ok": False, "error": f"{type(error).__name__}: {error}"[:2000], "seconds": time.monotonic() - t0}

    def refit():
        steps = {"pause": call(engine.pause_generation), "flush": call(engine.flush_cache)}
        if case["route"] == "disk":
            steps["update"] = call(
                engine.update_weights_from_disk, model_path=case["model_path"], weight_version=version
            )
        else:

            def join(port, group_name):
                return engine.init_weights_update_group("127.0.0.1", port, 1, 2, group_name, "gloo")

            def update(body):
                return engine.update_weights_from_distributed(
                    body["names"], body["dtypes"], body["shapes"], body["group_name"], weight_version=version
                )

            calls = _broadcast_update(case["model_path"], None, join, update)
            engine.destroy_weights_update_group(calls["group_name"])
            steps["update"] = {"ok": "error" not in str(calls.get("update")), "answer": calls}
        steps["continue"] = call(engine.continue_generation)
        steps["weight_version"] = call(engine.get_weight_version)
        return steps

    results = [None] * case["requests"]

    def rollout(index):
        body = {
            "input_ids": case["prompt"],
            "sampling_params": {"temperature": 0.0, "max_new_tokens": case["max_tokens"], "ignore_eos": True},
        }
        try:
            status, out = server.post("/generate", body)
            finish = out["meta_info"].get("finish_reason") if status == 200 else out
            results[index] = {"status": status, "tokens": len(out.get("output_ids", [])) if status == 200 else 0}
            results[index]["finish"] = finish
        except Exception as error:  # the server died under it
            results[index] = {"error": repr(error)}

    threads = [threading.Thread(target=rollout, args=(i,)) for i in range(case["requests"])]
    for thread in threads:
        thread.start()
    time.sleep(case.get("settle_s", 1))  # the rollouts are admitted and decoding
    steps = refit()
    for thread in threads:
        thread.join(timeout=600)
    return {**steps, "rollouts": results}


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


def settle(server, case):
    time.sleep(case["seconds"])
    return {"slept_s": case["seconds"]}


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


def _broadcast_update(model_path, session_calls, join, update):
    """A trainer's broadcast over gloo (SGLang takes the backend from the caller): this process is rank 0 of a
    weight-update group, the server's scheduler rank 1. `join(port, group_name)` asks the server to join the group,
    `update(body)` starts its update_weights_from_distributed (each in a thread: both block until this side acts);
    the checkpoint's tensors are then broadcast one by one while SGLang's handler receives them. `session_calls`
    (begin, end): the weight-update session around it where the release has one, or None. Returns the calls' answers."""
    import datetime

    import torch.distributed as dist
    from safetensors.torch import load_file
    from sglang.srt.utils.common import init_custom_process_group

    weights = sorted(load_file(os.path.join(model_path, "model.safetensors")).items())
    group_name, port, calls = "nrl-shim-test-weights", free_port(), {}

    def call(name, action, *args):
        try:
            calls[name] = action(*args)
        except Exception as error:  # the caller's own error (an HTTP error raised by slime's engine, say)
            calls[name] = {"error": f"{type(error).__name__}: {error}"[:2000]}

    joining = threading.Thread(target=call, args=("init", join, port, group_name))
    joining.start()
    group = init_custom_process_group(
        backend="gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        world_size=2,
        rank=0,
        group_name=group_name,
        timeout=datetime.timedelta(seconds=120),  # a server that never joins fails the case, not the run
    )
    joining.join()
    session = session_calls is not None and session_calls[0]()
    body = {
        "names": [name for name, _ in weights],
        "dtypes": [str(tensor.dtype).removeprefix("torch.") for _, tensor in weights],
        "shapes": [list(tensor.shape) for _, tensor in weights],
        "group_name": group_name,
    }
    updating = threading.Thread(target=call, args=("update", update, body))
    updating.start()
    for _, tensor in weights:
        dist.broadcast(tensor.contiguous(), src=0, group=group)
    updating.join(timeout=600)
    if session:
        call("end", session_calls[1])
    dist.destroy_process_group(group)
    return {"session": bool(session), "group_name": group_name, **calls}


def update_from_distributed(server, case):
    """A trainer's broadcast (update_weights_from_distributed, verl's and slime's route) over HTTP, inside a
    weight-update session where the release has them (0.5.21+: SGLang refuses the update outside one)."""

    def join(port, group_name):
        body = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2}
        return list(server.post("/init_weights_update_group", {**body, "group_name": group_name, "backend": "gloo"}))

    calls = _broadcast_update(
        case["model_path"],
        (
            lambda: server.post("/begin_weight_update", {})[0] == 200,  # 404 before 0.5.21: no sessions
            lambda: list(server.post("/end_weight_update", {})),
        ),
        join,
        lambda body: list(
            server.post("/update_weights_from_distributed", {**body, "flush_cache": case["flush_cache"]})
        ),
    )
    calls["destroy"] = list(server.post("/destroy_weights_update_group", {"group_name": calls.pop("group_name")}))
    return calls


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
    "settle": settle,
    "update_while_running": update_while_running,
    "update_while_retracted": update_while_retracted,
    "flush_while_running": flush_while_running,
    "chat": chat,
    "sample": generate,
    "group": group,
    "batch": batch,
    "nemo_rl_update": nemo_rl_update,
    "update_from_distributed": update_from_distributed,
    "slime_update": slime_update,
    "areal_update": areal_update,
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

    launch = run.get("launch", "cli")
    if launch == "slime":  # slime's SGLangEngine, from slime's source
        server = SlimeServer(run["model_path"], run.get("args", []), log_path, run["slime"])
    elif launch == "areal":  # AReaL's server and remote engine (its settings: areal_config)
        server = ArealServer(run["model_path"], run.get("args", []), log_path, run.get("areal_config"))
    else:
        route = {"cli": Server, "spawn": SpawnServer, "ray_actor": RayActorServer}[launch]
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
