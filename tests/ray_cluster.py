"""A throwaway Ray cluster started separately (`ray start --head`), as on a real cluster: its workers inherit none of
the driver's environment. Loopback only, no auth token. Stopped through the processes it started (found by its own
temp dir), never `ray stop --force`, which would stop every Ray on the machine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import psutil  # a dependency of Ray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SeparateCluster:
    def __init__(self, num_cpus: int = 2, env: dict[str, str] | None = None):
        self.num_cpus = num_cpus
        # No NRL_* and no PYTHONPATH: workers can reach the shim only through what the driver ships.
        base = {
            k: v for k, v in os.environ.items() if not k.startswith("NRL_") and k not in ("PYTHONPATH", "VLLM_USE_V1")
        }
        self.env = {**base, "RAY_AUTH_MODE": "disabled", **(env or {})}
        # AF_UNIX socket paths must stay < 108 bytes: a short dir under /tmp.
        self.temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"

    def __enter__(self) -> SeparateCluster:
        ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
        start = [
            ray_bin,
            "start",
            "--head",
            f"--port={self.port}",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.num_cpus}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
        ]
        started = subprocess.run(start, env=self.env, capture_output=True, text=True, timeout=180, cwd=self.temp_dir)
        if started.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start failed:\n{started.stdout}\n{started.stderr}")
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _processes(self) -> list[psutil.Process]:
        found = {}
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if any(self.temp_dir in arg for arg in proc.info["cmdline"] or ()):
                    found[proc.pid] = proc
                    for child in proc.children(recursive=True):
                        found[child.pid] = child
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        found.pop(os.getpid(), None)
        return list(found.values())

    def stop(self) -> None:
        procs = self._processes()
        for proc in procs:
            try:
                proc.terminate()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=5)  # a throwaway cluster: some Ray 2.43 processes ignore SIGTERM
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=10)
        deadline = time.monotonic() + 5
        while self._processes() and time.monotonic() < deadline:
            time.sleep(0.2)
