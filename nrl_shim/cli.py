"""nrl-shim command line: `doctor` (what applies here and why), `run -- CMD` (launcher), `explain` (vLLM demo)."""

import argparse
import json
import os
import platform
import subprocess
import sys

from . import __version__, registry
from .errors import ShimError
from .settings import VARIABLES, Settings

LIBRARIES = ("vllm", "torch", "transformers", "ray", "wrapt", "packaging")


def _library(name):
    from .libraries import find

    found = find(name, thorough=True)
    return {"version": found.version, "distribution": found.distribution, "also_installed": list(found.others),
            "text": found.describe()}


def _env_activation_status():
    """Is the start-up hook installed, and does a fresh interpreter with NRL_SHIM=1 really come up active?"""
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    pth = next((os.path.join(d, "nrl_shim.pth") for d in dirs if os.path.isfile(os.path.join(d, "nrl_shim.pth"))), None)
    probe = "import sys, json; m = sys.modules.get('nrl_shim'); print(json.dumps(bool(m and m.is_active())))"
    env = dict(os.environ, NRL_SHIM="1")
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    working = proc.returncode == 0 and proc.stdout.strip().endswith("true")
    detail = "a child interpreter with NRL_SHIM=1 came up active" if working else (
        f"a child interpreter with NRL_SHIM=1 did not activate (rc={proc.returncode}): "
        + (proc.stderr.strip().splitlines() or ["no output"])[-1])
    return {"pth": pth, "working": working, "detail": detail}


def doctor(as_json=False):
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
        settings = Settings.from_env(known_ids=registry.quirk_ids())
        report["settings"] = {name: os.environ.get(name) for name in VARIABLES} | {"effective": settings.as_dict()}
    except ShimError as err:
        settings = None
        report["settings_error"] = str(err)
    for quirk in registry.quirks():
        entry = {"id": quirk.id, "summary": quirk.summary, "library": quirk.library, "versions": quirk.versions,
                 "link": quirk.link}
        if settings is not None and not settings.is_enabled(quirk.id):
            entry["status"], entry["reason"] = "disabled", "listed in NRL_SHIM_DISABLE"
        else:
            applies, version, reason = quirk.gate()
            entry["status"], entry["reason"] = ("applies" if applies else "skipped"), reason
            if applies and settings is not None and quirk.describe:
                entry["detail"] = quirk.describe(settings, version)
        report["quirks"].append(entry)

    if as_json:
        print(json.dumps(_jsonable(report), indent=2, sort_keys=True))
    else:
        _print_doctor(report)
    ok = report["settings_error"] is None and report["env_activation"]["working"]
    return 0 if ok else 1


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return sorted(_jsonable(v) for v in value) if isinstance(value, (set, frozenset)) else [_jsonable(v) for v in value]
    return value


def _print_doctor(report):
    print(f"nrl-shim {report['nrl_shim']} on Python {report['python']}")
    print("libraries: " + ", ".join(v["text"] for v in report["libraries"].values()))
    if report["settings_error"]:
        print(f"settings: INVALID: {report['settings_error']}")
    else:
        print("settings:")
        for name, value in report["settings"].items():
            if name != "effective":
                print(f"  {name}={value if value is not None else '(unset)'}")
        print("  effective: " + ", ".join(f"{k}={v!r}" for k, v in report["settings"]["effective"].items()))
    print("quirks:")
    width = max(len(q["id"]) for q in report["quirks"])
    for q in report["quirks"]:
        print(f"  {q['id']:<{width}}  {q['status']:<8}  {q['reason']}")
        if q.get("detail"):
            print(f"  {'':<{width}}            {q['detail']}")
    act = report["env_activation"]
    print(f"env activation: .pth {act['pth'] or 'NOT installed'}; {act['detail']}")


def run(command):
    """Validate the settings, then exec `command` with NRL_SHIM=1 so it and every child process activate."""
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("nrl-shim run: give the command to run, e.g. `nrl-shim run -- python train.py`", file=sys.stderr)
        return 2
    try:
        Settings.from_env(known_ids=registry.quirk_ids())
    except ShimError as err:
        print(f"nrl-shim: error: {err}", file=sys.stderr)
        return 2
    os.environ["NRL_SHIM"] = "1"
    try:
        os.execvp(command[0], command)  # replaces this process, so the exit code is the command's own
    except OSError as err:
        print(f"nrl-shim run: cannot run {command[0]!r}: {err.strerror}", file=sys.stderr)
        return 127


def main(argv=None):
    parser = argparse.ArgumentParser(prog="nrl-shim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="versions, effective settings, which fixes apply here and why")
    doc.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_parser("run", help="run a command with the shim active in it and all its children: run -- CMD ...")
    sub.add_parser("explain", help="show what the shim changes in a real vLLM engine config", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "run":
        return run(rest)
    if args.command == "explain":
        from .explain import main as explain_main

        return explain_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return doctor(as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
