"""The job report: what each fix did in every process of a job, read after the job (or while it runs).

Where the records live: NRL_SHIM_REPORT_DIR, an absolute directory (`nrl-shim run` makes one per job under
$XDG_STATE_HOME/nrl-shim/jobs, default ~/.local/state/nrl-shim/jobs, keeping the newest 20, unless you set it; unset or
`off`: nothing is written). Every process where the shim is active appends its `nrl_shim` log records (INFO and up:
the lines you see) to <dir>/<host>-<pid>.jsonl, one JSON object per line, the first describing the process (role,
host, pid, parent, Python, Ray node). A record is written when a fix logs: at activation and at the events fixes log
once per process (a reset, a change), never per request.

Across nodes: the variable reaches Ray workers with the other NRL_* settings, so each node keeps its processes' files
on its own disk. A Ray worker announces its node and directory in Ray's key-value store (one put per process), and a
Ray driver notes the cluster's address in its file; `nrl-shim report` reads the local directory and, while that
cluster is up, every announced one through one Ray task on its node.

Never fails a job: a directory that can't be written costs one warning line per process, and the records stop there.
Stdlib only on the recording side (it runs in every process); the reading side is for the CLI.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import TextIO

VARIABLE = "NRL_SHIM_REPORT_DIR"
KV_NAMESPACE = "nrl_shim_report"
KINDS = ("changed", "unchanged", "skipped", "unverified", "warning", "error", "info")


def directory_from_env() -> str | None:
    raw = os.environ.get(VARIABLE, "").strip()
    return None if not raw or raw.lower() == "off" else raw


TAG = "nrl_shim"  # the LogRecord attribute report.py sets: {"quirk": id, "kind": one of KINDS[, "state": verdict]}


def kind_of(record: logging.LogRecord) -> str:
    """What a record says a fix did: the kind report.py gave it; a record logged without one (a plugin calling
    logging itself) by its level only."""
    tagged = getattr(record, TAG, None)
    if isinstance(tagged, dict) and tagged.get("kind") in KINDS:
        return tagged["kind"]
    if record.levelno >= logging.ERROR:
        return "error"
    return "warning" if record.levelno >= logging.WARNING else "info"


def quirk_of(record: logging.LogRecord, message: str) -> str | None:
    """The fix a record is about: the one report.py gave it, else a leading `[quirk-id] ` in its text."""
    tagged = getattr(record, TAG, None)
    if isinstance(tagged, dict) and tagged.get("quirk"):
        return str(tagged["quirk"])
    if message.startswith("[") and "] " in message:
        return message[1 : message.index("] ")]
    return None


def _ray_worker():
    """(role, node id, GCS address) when this process is a connected Ray worker or driver, else None."""
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        worker = ray._private.worker.global_worker
        if not worker.connected:
            return None
        context = ray.get_runtime_context()
        if worker.mode == ray.WORKER_MODE:
            role = "ray actor" if context.get_actor_id() else "ray task"
        else:
            role = "ray driver"
        return role, context.get_node_id(), context.gcs_address
    except Exception:  # a Ray without these names: the process is still recorded, without its node
        return None


def _role() -> str:
    import multiprocessing

    name = multiprocessing.current_process().name  # vLLM names the processes it starts
    if name.startswith("EngineCore"):
        return "engine core"
    if "Worker" in name:
        return "vllm worker"
    run_pid = os.environ.get("NRL_SHIM_RUN_PID")
    if run_pid == str(os.getppid()):
        return "driver"
    return "child" if run_pid else "process"  # inside `nrl-shim run` every other process descends from the driver


class Recorder(logging.Handler):
    """Appends this process's records to its file in the report directory (a forked child gets a file of its own)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self._pid: int | None = None
        self._file: TextIO | None = None
        self._failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if self._failed:
            return
        try:
            if self._pid != os.getpid():
                self._open()
            if self._file is None:
                return
            message = record.getMessage()
            line = {
                "t": round(record.created, 3),
                "level": record.levelname,
                "quirk": quirk_of(record, message),
                "kind": kind_of(record),
                "message": message,
            }
            tagged = getattr(record, TAG, None)
            if isinstance(tagged, dict) and tagged.get("state"):
                line["state"] = tagged["state"]  # the fix's verdict, as doctor names it (registry.verdict)
            self._write(line)
        except Exception as error:  # never fail the job over its report
            self._fail(error)

    def note(self, **fields: object) -> None:
        """A line about the process itself (e.g. the Ray cluster a driver joined)."""
        if self._failed:
            return
        try:
            if self._pid != os.getpid():
                self._open()
            if self._file is not None:
                self._write({"t": round(time.time(), 3), "note": fields})
        except Exception as error:
            self._fail(error)

    def _write(self, line: dict) -> None:
        assert self._file is not None
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def _open(self) -> None:
        self._pid, self._file = os.getpid(), None  # an inherited file is the parent's: never written from here
        directory = directory_from_env()
        if directory is None or os.environ.get("NRL_SHIM", "").strip().lower() in ("0", "false", "no", "off"):
            return  # no report, or the shim is off in this process (NRL_SHIM=0 is off everywhere)
        os.makedirs(directory, exist_ok=True)
        host = socket.gethostname()
        self._file = open(os.path.join(directory, f"{host}-{self._pid}.jsonl"), "a", encoding="utf-8")
        ray_worker = _ray_worker()
        process = {
            "pid": self._pid,
            "ppid": os.getppid(),
            "host": host,
            "role": ray_worker[0] if ray_worker else _role(),
            "python": sys.executable,
            "argv": [str(a)[:200] for a in sys.argv[:3]],
            "started": round(time.time(), 3),
        }
        if ray_worker:
            process["ray_node"], process["ray_address"] = ray_worker[1], ray_worker[2]
        self._write({"process": process})
        if ray_worker and ray_worker[0] != "ray driver":
            _announce(ray_worker[1], directory)

    def _fail(self, error: BaseException) -> None:
        self._failed = True
        print(
            f"nrl_shim WARNING: job report: can't write to {directory_from_env()!r} ({type(error).__name__}: {error}); "
            f"this process's records are not kept ({VARIABLE})",
            file=sys.stderr,
        )


def _announce(node_id: str, directory: str) -> None:
    """Tell the cluster where this node keeps records, so `nrl-shim report` can read them there."""
    try:
        from ray.experimental import internal_kv

        key = json.dumps([node_id, directory]).encode()
        internal_kv._internal_kv_put(key, b"1", overwrite=True, namespace=KV_NAMESPACE)
    except Exception:  # an older Ray, or no GCS: the local files are still there
        pass


_RECORDER: Recorder | None = None


def recorder() -> Recorder:
    """The process's one recorder (report.logger() attaches it to the `nrl_shim` logger)."""
    global _RECORDER
    if _RECORDER is None:
        _RECORDER = Recorder()
    return _RECORDER


def note_ray_driver(started_here: bool) -> None:
    """Called after ray.init in a driver: its file names the cluster, so the report can reach the other nodes
    (`started_here`: ray.init started a local cluster, which ends with this driver and has no other node)."""
    if directory_from_env() is None:
        return
    worker = _ray_worker()
    if worker is not None:
        recorder().note(ray_address=worker[2], ray_node=worker[1], started_here=started_here)


# --- reading (the CLI) ---


def read_directory(directory: str, skip: Iterable[str] = ()) -> dict[str, str]:
    """The report files of `directory` by name (text), except those in `skip`. Stdlib only: Ray runs it by value on
    other nodes."""
    import os as _os

    found: dict[str, str] = {}
    try:
        names = sorted(_os.listdir(directory))
    except OSError:
        return found
    for name in names:
        if name.endswith(".jsonl") and name not in set(skip):
            try:
                with open(_os.path.join(directory, name), encoding="utf-8") as f:
                    found[name] = f.read()
            except OSError:
                continue
    return found


def parse(name: str, text: str, source: str) -> dict:
    """One process: its description, its records and its notes (a line cut short by a crash is dropped)."""
    process: dict = {"file": name, "source": source, "records": [], "notes": []}
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if "process" in line:
            process.update(line["process"])
        elif "note" in line:
            process["notes"].append(line["note"])
            if line["note"].get("ray_node"):  # a driver joins its cluster after its first records
                process.setdefault("ray_node", line["note"]["ray_node"])
        else:
            process["records"].append(line)
    return process


def gather(directory: str, say=None, timeout: float = 60.0) -> tuple[list[dict], list[str]]:
    """Every process's records: the local directory's, then (while the job's Ray cluster is up) those each node
    announced. Returns (processes, problems: what could not be read, in words)."""
    files = read_directory(directory)
    processes = [parse(name, text, "local") for name, text in files.items()]
    problems: list[str] = []
    notes = [note for p in processes for note in p["notes"] if note.get("ray_address")]
    addresses = {note["ray_address"] for note in notes} | {p["ray_address"] for p in processes if p.get("ray_address")}
    local_only = {note["ray_address"] for note in notes if note.get("started_here")}
    for address in sorted(addresses):
        if say and address not in local_only:
            say(f"reading the records of the other nodes of Ray cluster {address} ...")
        try:
            remote = _gather_ray(address, set(files), timeout)
        except Exception as error:  # the cluster is gone or unreachable
            if address not in local_only:  # one ray.init() started in the job: one node, its files are local
                problems.append(f"Ray cluster {address}: {type(error).__name__}: {error}")
            continue
        for node, found in remote.items():
            for name, text in found.items():
                if name not in files:
                    files[name] = text
                    processes.append(parse(name, text, f"ray node {node[:8]}"))
    return processes, problems


def _gather_ray(address: str, local: set[str], timeout: float) -> dict[str, dict[str, str]]:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=3):  # fail fast where nothing listens any more
        pass
    os.environ.pop(VARIABLE, None)  # this reader's own Ray processes must not record into the job's report
    import ray
    from ray.experimental import internal_kv
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import nrl_shim.job_report as this

    ray.cloudpickle.register_pickle_by_value(this)  # the cluster's Python needn't have nrl-shim
    ray.init(address=address, logging_level="ERROR", log_to_driver=False, runtime_env={"env_vars": {"NRL_SHIM": "0"}})
    try:
        announced: dict[str, set[str]] = {}
        for key in internal_kv._internal_kv_list(b"", namespace=KV_NAMESPACE):
            node, directory = json.loads(key)
            announced.setdefault(node, set()).add(directory)
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        reader = ray.remote(num_cpus=0)(_read_many)
        pending = {
            node: reader.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                sorted(dirs), sorted(local)
            )
            for node, dirs in announced.items()
            if node in alive
        }
        return {node: ray.get(ref, timeout=timeout) for node, ref in pending.items()}
    finally:
        ray.shutdown()


def _read_many(directories: list[str], skip: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for directory in directories:
        found.update(read_directory(directory, skip))
    return found


def summarize(processes: list[dict]) -> dict[str, dict[str, list]]:
    """Per fix and kind: [(process, message), ...], each process once per fix and kind (its first such record)."""
    fixes: dict[str, dict[str, list]] = {}
    for process in processes:
        seen = set()
        for record in process["records"]:
            quirk, kind = record.get("quirk") or "(shim)", record.get("kind", "info")
            if (quirk, kind) in seen:
                continue
            seen.add((quirk, kind))
            fixes.setdefault(quirk, {}).setdefault(kind, []).append((process, record["message"]))
    return fixes


def where(process: dict) -> str:
    node = f" node {process['ray_node'][:6]}" if process.get("ray_node") else ""
    return f"{process.get('role', '?')}@{process.get('host', '?')}{node} (pid {process.get('pid', '?')})"


def table(directory: str, processes: list[dict], problems: list[str]) -> str:
    """The short form: per fix what it did and where; then what could not be read."""
    roles: dict[str, int] = {}
    for process in processes:
        roles[process.get("role", "?")] = roles.get(process.get("role", "?"), 0) + 1
    hosts = {(p.get("host"), p.get("ray_node")) for p in processes}
    lines = [
        f"nrl-shim report: {len(processes)} process(es) where the shim was active ("
        + ", ".join(f"{n} {role}" for role, n in sorted(roles.items()))
        + f"; {len({h for h, _ in hosts})} host(s), {len({n for _, n in hosts if n})} Ray node(s)); records in "
        + directory
    ]
    for quirk, kinds in sorted(summarize(processes).items()):
        parts = []
        for kind in ("changed", "unverified", "error", "warning", "skipped"):
            entries = kinds.get(kind, [])
            if not entries:
                continue
            places = ", ".join(where(p) for p, _ in entries[:3]) + (
                f", +{len(entries) - 3}" if len(entries) > 3 else ""
            )
            label = {
                "skipped": "skipped in",
                "warning": "warned in",
                "error": "ERROR in",
                "unverified": "acts unverified in",
            }.get(kind, "changed in")
            detail = ""
            if kind in ("skipped", "error", "warning", "unverified"):
                detail = ": " + entries[0][1].split("] ", 1)[-1][:160]
            parts.append(f"{label} {len(entries)}: {places}{detail}")
        idle = len(kinds.get("unchanged", []))
        if idle:
            parts.append(f"nothing to change in {idle}")
        if parts:
            lines.append(f"  [{quirk}] " + "; ".join(parts))
    probe_lines, _ = _probe(processes)
    if probe_lines:
        lines.append("  refit probe (docs/probe.md):")
        lines.extend("    " + line for line in probe_lines)
    lines.extend(f"  not read: {problem}" for problem in problems)
    return "\n".join(lines)


def as_json(directory: str, processes: list[dict], problems: list[str]) -> dict:
    return {
        "directory": directory,
        "processes": processes,
        "fixes": {
            quirk: {kind: [{"process": where(p), "message": m} for p, m in entries] for kind, entries in kinds.items()}
            for quirk, kinds in summarize(processes).items()
        },
        "probe": dict(zip(("replicas", "findings"), _probe(processes))),
        "not_read": problems,
    }


def _probe(processes: list[dict]) -> tuple[list[str], list[str]]:
    from nrl_shim.probe import replicas

    return replicas.compare(processes)


# --- where jobs keep their records (nrl-shim run) ---

KEEP_JOBS = 20


def jobs_root() -> str:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "nrl-shim", "jobs")


def new_job_directory() -> str:
    """A fresh directory for one `nrl-shim run`, the oldest beyond the newest KEEP_JOBS removed."""
    import shutil

    root = jobs_root()
    os.makedirs(root, exist_ok=True)
    old = sorted(os.listdir(root))
    for name in old[: max(0, len(old) - (KEEP_JOBS - 1))]:
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    path = os.path.join(root, time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{os.getpid()}")
    os.makedirs(path)
    return path


def latest_job_directory() -> str | None:
    root = jobs_root()
    try:
        names = sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n)))
    except OSError:
        return None
    return os.path.join(root, names[-1]) if names else None
