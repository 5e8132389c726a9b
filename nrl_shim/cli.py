"""nrl-shim command line: `doctor` (what applies here and why), `run -- CMD` (launcher; prints the job report at the
end), `report [DIR] [--json]` (what each fix did in every process of a job), `explain` (vLLM demo).

Exit status: 0 success; 1 doctor found the shim unusable here (invalid settings, env activation broken); 2 bad command
line or settings for `run`/`explain`; 3 `doctor --strict` and a fix would be skipped (a release with its bug that it
cannot reach, or what it needs missing) or a part of one is missing (PARTS); a release without the bug (not affected)
passes;
`run` otherwise exits with the command's own status.
"""

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys

from . import __version__, registry
from ._argparse import OneLineErrorParser
from .errors import ShimError

LIBRARIES = ("vllm", "sglang", "torch", "transformers", "ray", "wrapt", "packaging")


def _library(name):
    from .libraries import find

    found = find(name, thorough=True)
    return {
        "version": found.version,
        "distribution": found.distribution,
        "also_installed": list(found.others),
        "text": found.describe(),
    }


def _env_activation_status():
    """Is the start-up hook installed, and does a fresh interpreter with NRL_SHIM=1 really come up active?"""
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    pth = next((os.path.join(d, "nrl_shim.pth") for d in dirs if os.path.isfile(os.path.join(d, "nrl_shim.pth"))), None)
    probe = "import sys, json; m = sys.modules.get('nrl_shim'); print(json.dumps(bool(m and m.is_active())))"
    env = dict(os.environ, NRL_SHIM="1")
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    working = proc.returncode == 0 and proc.stdout.strip().endswith("true")
    detail = (
        "a child interpreter with NRL_SHIM=1 came up active"
        if working
        else (
            f"a child interpreter with NRL_SHIM=1 did not activate (rc={proc.returncode}): "
            + (proc.stderr.strip().splitlines() or ["no output"])[-1]
        )
    )
    return {"pth": pth, "working": working, "detail": detail}


# Doctor's states for a fix are registry.verdict()'s, the function activation gates with: `applies`: acts, on a
# verified release; `unverified`: acts, on a release newer than those verified (its checks of what it touches passed);
# `skipped`: on such a release, something it needs is missing; `out-of-range`: a release with the bug the fix cannot
# reach (one whose fix declares a CASE has "case" in its entry: that case is named when it happens, strict: an error
# then); `fixed-upstream`: the installed release has upstream's fix; `part-missing`: acts, but a part of it (PARTS)
# lacks a name on this release, so the case that part covers is only named when it happens; `not-affected`: a release
# without the bug; `idle`: applies, nothing to do with these settings; `not-installed`; `disabled`.
APPLIES, UNVERIFIED, SKIPPED, PART_MISSING = (
    registry.APPLIES,
    registry.UNVERIFIED,
    registry.SKIPPED,
    registry.PART_MISSING,
)
OUT_OF_RANGE, NOT_AFFECTED, ACTS, STRICT_FAILS = (
    registry.OUT_OF_RANGE,
    registry.NOT_AFFECTED,
    registry.ACTS,
    registry.STRICT_FAILS,
)
SHOWN = {
    APPLIES: "acts, verified",
    UNVERIFIED: "acts, unverified",
    SKIPPED: "skipped",
    PART_MISSING: "acts, part missing",
    NOT_AFFECTED: "not affected",
}  # the rest as they are
EXIT_OK, EXIT_UNUSABLE, EXIT_STRICT = 0, 1, 3


def _quirk_entry(quirk, settings):
    entry = {
        "id": quirk.id,
        "summary": quirk.summary,
        "library": quirk.library,
        "versions": quirk.versions,
        "link": quirk.link,
    }
    source = registry.origin(quirk.id)
    if source != registry.BUILTIN:
        entry["from"] = source  # a plugin quirk: the distribution that declared it (entry-point group nrl_shim.quirks)
    release = registry.release_of(quirk)
    # What REQUIRES and PARTS name, imported here (a job checks each module when it is imported): only where the
    # verdict reads them, a fix that acts.
    modules = registry.import_named(quirk) if release[0][0] and (release[1] or quirk.parts) else None
    found = registry.verdict(quirk, settings, modules, release)
    reason = found.reason.removeprefix("not affected: ")  # the state says it
    if found.case:
        entry["case"] = found.case
        reason += f"; {found.case} is named when it happens (strict mode: an error then)"
    entry["status"], entry["reason"], entry["strict"] = found.state, reason, found.strict
    if found.parts:
        entry["missing_parts"] = found.parts
    if found.state in (APPLIES, UNVERIFIED, PART_MISSING) and settings is not None and quirk.describe:
        entry["detail"] = quirk.describe(settings, found.version)
    return entry


def doctor(as_json=False, strict=False):
    report = {
        "nrl_shim": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "libraries": {name: _library(name) for name in LIBRARIES},
        "settings": None,
        "settings_error": None,
        "quirks": [],
        "env_activation": _env_activation_status(),
    }
    try:
        settings = registry.load_settings()
        report["settings"] = {
            "set": {v.name: os.environ.get(v.name) for v in registry.variables()},
            "effective": settings.as_environment(),
        }
    except ShimError as err:
        settings = None
        report["settings_error"] = str(err)
    # Doctor imports the modules fixes touch; vLLM configures its logging to stdout at import (0.9.1: "Automatically
    # detected platform cpu."): bound to stderr here, so stdout holds doctor's own output (--json: one JSON document).
    with contextlib.redirect_stdout(sys.stderr):
        report["quirks"] = [_quirk_entry(quirk, settings) for quirk in registry.quirks()]
    if report["settings_error"] is not None or not report["env_activation"]["working"]:
        status = EXIT_UNUSABLE
    elif strict and any(q["status"] in STRICT_FAILS for q in report["quirks"]):
        status = EXIT_STRICT
    else:
        status = EXIT_OK
    report["exit_status"] = status
    if as_json:
        print(json.dumps(_jsonable(report), indent=2, sort_keys=True))
    else:
        _print_doctor(report, strict)
    return status


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return (
            sorted(_jsonable(v) for v in value)
            if isinstance(value, (set, frozenset))
            else [_jsonable(v) for v in value]
        )
    return value


def _print_doctor(report, strict=False):
    print(f"nrl-shim {report['nrl_shim']} on Python {report['python']}")
    print("libraries: " + ", ".join(v["text"] for v in report["libraries"].values()))
    if report["settings_error"]:
        print(f"settings: INVALID: {report['settings_error']}")
    else:
        set_here = {k: v for k, v in report["settings"]["set"].items() if v is not None}
        print("settings set here: " + (" ".join(f"{k}={v}" for k, v in set_here.items()) or "none"))
        print("effective settings:")
        for name, value in report["settings"]["effective"].items():
            print(f"  {name}={value}")
    print("fixes:")
    width = max(len(q["id"]) for q in report["quirks"])
    state_width = max(len(SHOWN.get(q["status"], q["status"])) for q in report["quirks"])
    for q in report["quirks"]:
        print(f"  {q['id']:<{width}}  {SHOWN.get(q['status'], q['status']):<{state_width}}  {q['reason']}")
        if q.get("detail"):
            print(f"  {'':<{width}}  {'':<{state_width}}  {q['detail']}")
        if q.get("from"):
            print(f"  {'':<{width}}  {'':<{state_width}}  plugin from the distribution {q['from']}")
    act = report["env_activation"]
    print(f"env activation: .pth {act['pth'] or 'NOT installed'}; {act['detail']}")
    status = report["exit_status"]
    if status == EXIT_UNUSABLE:
        print("verdict: NOT ready (exit 1): fix the settings or the install above")
    elif status == EXIT_STRICT:
        if any(q["status"] in (OUT_OF_RANGE, SKIPPED) for q in report["quirks"]):
            why = (
                "for its version" if any(q["status"] == OUT_OF_RANGE for q in report["quirks"]) else "for what it lacks"
            )
            cases, parts = _cases(report["quirks"]), _parts(report["quirks"])
            print(
                f"verdict: a fix would be skipped {why} (exit 3, --strict); {_tally(report['quirks'])}"
                + (f"; named when its case happens (strict: an error then): {cases}" if cases else "")
                + (f"; part missing: {parts}" if parts else "")
            )
        else:
            print(f"verdict: a part of a fix is missing here (exit 3, --strict): {_parts(report['quirks'])}")
    else:
        old = [
            q["id"] + (f" ({q['case']}: named when it happens)" if q.get("case") else "")
            for q in report["quirks"]
            if q["status"] == OUT_OF_RANGE
        ]
        lacking = [q["id"] for q in report["quirks"] if q["status"] == SKIPPED]
        parts = _parts(report["quirks"])
        print(
            f"verdict: ready; {_tally(report['quirks'])}"
            + (f"; skipped for their version: {', '.join(old)}" if old else "")
            + (f"; skipped for what they lack: {', '.join(lacking)}" if lacking else "")
            + (f"; part missing: {parts}" if parts else "")
            + (" (--strict makes that exit 3)" if old or lacking or parts else "")
        )


def _cases(quirks):
    """The fixes out of range whose case is named when it happens, e.g. "vllm-lora-refit (a LoRA adapter served)"."""
    return ", ".join(f"{q['id']} ({q['case']})" for q in quirks if q["status"] == OUT_OF_RANGE and q.get("case"))


def _parts(quirks):
    """The fixes with a part missing, e.g. "vllm-layerwise-refit (refits in a row)"."""
    return ", ".join(f"{q['id']} ({', '.join(q['missing_parts'])})" for q in quirks if q["status"] == PART_MISSING)


def _tally(quirks):
    """How many fixes act here, in one phrase: the verdict's first words."""
    acts = [q for q in quirks if q["status"] in ACTS]
    unverified = sum(q["status"] == UNVERIFIED for q in acts)
    text = f"{len(acts)} of {len(quirks)} fixes act"
    if unverified:
        text += f" ({unverified} on a release newer than those verified)"
    return text


def run(command):
    """Validate the settings, run `command` with NRL_SHIM=1 (it and every child process activate) and a job report
    directory, then print what each fix did across the job's processes. Exits with the command's own status."""
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("nrl-shim run: give the command to run, e.g. `nrl-shim run -- python train.py`", file=sys.stderr)
        return 2
    try:
        settings = registry.load_settings()
    except ShimError as err:
        print(f"nrl-shim: error: {err}", file=sys.stderr)
        return 2
    os.environ["NRL_SHIM"] = "1"
    directory = _job_directory(settings.report_dir)
    if directory is None:  # no report: nothing to do after the command, so it replaces this process
        try:
            os.execvp(command[0], command)
        except OSError as err:
            print(f"nrl-shim run: cannot run {command[0]!r}: {err.strerror}", file=sys.stderr)
            return 127
    os.environ["NRL_SHIM_REPORT_DIR"] = directory
    os.environ["NRL_SHIM_RUN_PID"] = str(os.getpid())  # the command's processes know they are the driver
    try:
        child = subprocess.Popen(command)
    except OSError as err:
        print(f"nrl-shim run: cannot run {command[0]!r}: {err.strerror}", file=sys.stderr)
        return 127
    import signal

    def forward(signum, frame):  # Ctrl-C, a scheduler's TERM: the command decides, as if run directly
        child.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    code = child.wait()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    try:
        _print_report(directory, sys.stderr)
    except Exception as err:  # the report never changes the job's outcome
        print(f"nrl-shim run: the job report could not be read ({type(err).__name__}: {err})", file=sys.stderr)
    return code if code >= 0 else 128 - code


def _job_directory(setting):
    """Where this job's processes record (None: no report). The user's NRL_SHIM_REPORT_DIR wins; else a new one."""
    if setting == "off":
        return None
    from . import job_report

    try:
        if setting:
            os.makedirs(setting, exist_ok=True)
            return setting
        return job_report.new_job_directory()
    except OSError as err:
        where = setting or job_report.jobs_root()
        print(
            f"nrl-shim run: warning: no job report ({where}: {err.strerror}); set NRL_SHIM_REPORT_DIR to a writable "
            "directory, or to off",
            file=sys.stderr,
        )
        return None


def _say(message):
    print(f"nrl-shim: {message}", file=sys.stderr, flush=True)


def _print_report(directory, stream, as_json=False):
    from . import job_report

    processes, problems = job_report.gather(directory, say=_say)
    if as_json:
        print(json.dumps(job_report.as_json(directory, processes, problems), indent=1), file=stream)
    else:
        print(job_report.table(directory, processes, problems), file=stream)


def report(directory=None, as_json=False):
    """`nrl-shim report [DIR] [--json]`: the job report of DIR (default: the newest `nrl-shim run` job)."""
    from . import job_report

    directory = directory or job_report.directory_from_env() or job_report.latest_job_directory()
    if directory is None or not os.path.isdir(directory):
        where = directory or job_report.jobs_root()
        print(f"nrl-shim report: no job report at {where}; run a job with `nrl-shim run -- ...`", file=sys.stderr)
        return 1
    _print_report(directory, sys.stdout, as_json=as_json)
    return 0


def main(argv=None):
    parser = OneLineErrorParser(
        prog="nrl-shim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"nrl-shim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineErrorParser)
    doc = sub.add_parser("doctor", help="versions, effective settings, which fixes apply here and why")
    doc.add_argument("--json", action="store_true", help="machine-readable output")
    doc.add_argument(
        "--strict", action="store_true", help="exit 3 when a fix would be skipped, or a part of one is missing"
    )
    sub.add_parser(
        "run", help="run a command with the shim active in it and all its children, then report: run -- CMD ..."
    )
    rep = sub.add_parser("report", help="what each fix did in every process of a job (default: the newest run)")
    rep.add_argument("directory", nargs="?", help="a job's report directory (NRL_SHIM_REPORT_DIR)")
    rep.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_parser("explain", help="show what the shim changes in a real vLLM engine config", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "run":
        return run(rest)
    if args.command == "report":
        if rest:
            rep.error(f"unrecognized arguments: {' '.join(rest)}")
        return report(args.directory, as_json=args.json)
    if args.command == "explain":
        from .explain import main as explain_main

        return explain_main(rest)
    if rest:
        doc.error(f"unrecognized arguments: {' '.join(rest)}")
    return doctor(as_json=args.json, strict=args.strict)


if __name__ == "__main__":
    sys.exit(main())
