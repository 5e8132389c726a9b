"""The job report without vLLM (the unit sessions): `nrl-shim run` gives the job a directory, every process where the
shim is active records its `nrl_shim` lines there, `nrl-shim report` reads them. The fixes' log calls are the shim's
own report API (what every quirk calls); the real run, with engines, Ray actors and a second node, is
test_reliability_ray.py's job-report test.
"""

import json
import os
import subprocess
import sys

from conftest import child_env

JOB = r"""
import os, subprocess, sys
from nrl_shim import report

report.changed("demo-fix", "setting", "before", "after", "why")
report.unchanged("idle-fix", "thing", "already right")
code = "from nrl_shim import report; report.changed('demo-fix', 'setting', 'before', 'after', 'why')"
pids = {}
for name, shim in (("on", "1"), ("off", "0")):
    child = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, NRL_SHIM=shim))
    child.wait()
    pids[name] = child.pid
forked = os.fork()
if forked == 0:  # a forked child inherits the logger: it must write a file of its own
    report.warn_once("demo-fix", "k", "[demo-fix] a warning from the forked child")
    os._exit(0)
os.waitpid(forked, 0)
print(dict(pids, forked=forked, driver=os.getpid()))
"""


CLI = os.path.join(os.path.dirname(sys.executable), "nrl-shim")


def nrl_shim(*args, env=None, check=True, cwd=None):
    proc = subprocess.run([CLI, *args], env=child_env(env), capture_output=True, text=True, timeout=300, cwd=cwd)
    assert proc.returncode == 0 or not check, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def run_job(tmp_path, env=None):
    return nrl_shim(
        "run",
        "--",
        sys.executable,
        "-c",
        JOB,
        env={"XDG_STATE_HOME": str(tmp_path / "state"), **(env or {})},
        cwd=tmp_path,
    )


def test_run_reports_every_process_where_the_shim_was_active(tmp_path):
    proc = run_job(tmp_path)
    pids = eval(proc.stdout.strip().splitlines()[-1])
    (job,) = (tmp_path / "state" / "nrl-shim" / "jobs").iterdir()
    assert sorted(os.listdir(job)) == sorted(
        f"{os.uname().nodename}-{pids[n]}.jsonl" for n in ("driver", "on", "forked")
    )
    table = proc.stderr[proc.stderr.index("nrl-shim report: 3 process(es)") :]
    assert f"[demo-fix] changed in 2: driver@{os.uname().nodename} (pid {pids['driver']})" in table, table
    assert "warned in 1" in table and "a warning from the forked child" in table
    assert "[idle-fix] nothing to change in 1" in table

    again = nrl_shim("report", "--json", env={"XDG_STATE_HOME": str(tmp_path / "state")})
    report = json.loads(again.stdout)
    assert report["directory"] == str(job)
    roles = {p["pid"]: p["role"] for p in report["processes"]}
    assert roles == {pids["driver"]: "driver", pids["on"]: "child", pids["forked"]: "child"}, roles
    assert pids["off"] not in roles  # NRL_SHIM=0: the shim is off there, nothing recorded
    changes = report["fixes"]["demo-fix"]["changed"]
    assert [c["message"] for c in changes] == ["[demo-fix] setting: 'before' -> 'after' (why)"] * 2


def test_report_dir_off_or_unwritable_never_fails_the_job(tmp_path):
    proc = run_job(tmp_path, env={"NRL_SHIM_REPORT_DIR": "off"})
    assert "nrl-shim report:" not in proc.stderr and not (tmp_path / "state").exists()
    # A directory no process can create: each process that records says so once, and goes on.
    code = "from nrl_shim import report; report.changed('a', 'b', 1, 2, 'c'); report.changed('a', 'd', 1, 2, 'c')"
    env = child_env({"NRL_SHIM": "1", "NRL_SHIM_REPORT_DIR": "/proc/nrl-shim-report"})
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "job report: can't write to '/proc/nrl-shim-report'" in line]
    assert len(said) == 1, proc.stderr
    assert proc.stderr.count("[a] b: 1 -> 2 (c)") == 1  # the log itself is unaffected


def test_a_relative_report_dir_is_refused_by_name(tmp_path):
    proc = nrl_shim("run", "--", sys.executable, "-c", "pass", env={"NRL_SHIM_REPORT_DIR": "jobs"}, check=False)
    assert proc.returncode == 2
    assert "NRL_SHIM_REPORT_DIR='jobs' is not valid; accepted: an absolute directory path, or off" in proc.stderr


def test_a_record_of_activation_carries_the_fixes_verdict(tmp_path, monkeypatch):
    # What activation says of a fix (skipped, not affected, unverified) is written with its verdict's state, the one
    # doctor shows (registry.verdict): the job report and doctor name a fix's state alike.
    import logging

    from nrl_shim import job_report, report

    monkeypatch.setenv(job_report.VARIABLE, str(tmp_path))
    recorder = job_report.Recorder()
    report.logger().addHandler(recorder)
    try:
        report.record("demo-fix", "skipped", "[demo-fix] fix skipped: why", state="out-of-range")
        report.record("demo-fix", "changed", "[demo-fix] a change")  # a fix's own line: no verdict in it
    finally:
        report.logger().removeHandler(recorder)
        logging.Handler.close(recorder)
    (written,) = tmp_path.glob("*.jsonl")
    lines = [line for line in map(json.loads, written.read_text().splitlines()) if "kind" in line]
    # (the logger may already have a recorder of its own for this directory: each line is then written twice)
    said = list(dict.fromkeys((line["kind"], line.get("state")) for line in lines))
    assert said == [("skipped", "out-of-range"), ("changed", None)], lines
