"""Start-up cost of the shim, measured in one run and printed as figures and ratios (a script, not a test).

0. what a plugin scan would cost at every start without the cached index: importing importlib.metadata and
   entry_points(group=...) over this interpreter's distributions
1. interpreter start (`python -c pass`) with NRL_SHIM=1 vs unset, no target imported   (goal: <= +2 ms)
   for the package under test as it is, with a plugin installed (examples/quirk-plugin, installed into the tree's
   directory with uv/pip --target: a real dist-info with its entry point, found through the cached plugin index), and
   with --synthetic N (default 30) synthetic quirks registered on top of today's built-ins; with --baseline REF also
   for that git revision of this repository, both ways (e.g. the code before a change, side by side in the same run);
   then the first start after a plugin is installed (the cache is stale: one scan)
2. `python -X importtime`: cumulative import time of nrl_shim, and how many nrl_shim modules start-up loads, per tree
3. `import nrl_shim`: time, and which heavy modules it pulled in   (goal: none of torch/vllm/transformers/numpy)
4. `import torch` with the shim's import hooks registered vs none   (goal: ratio <= 1.02)

Every tree measured is a copy of the package in a temp dir, compiled as pip installs it, put first on PYTHONPATH; the
interpreter's installed nrl_shim.pth (pip install . puts it in site-packages) activates it with NRL_SHIM=1. The
synthetic quirks exist only in these copies: modules shaped like a real quirk (declarations, one setting, patch and
unpatch, describe) whose targets are never imported, registered as built-ins (trees with entry points: a pyproject.toml
beside the copy declaring them, the quirk index regenerated from it; older trees: appended to registry.QUIRK_MODULES
and, where the tree has one, its index regenerated). Every side gets its own empty XDG_CACHE_HOME, warmed up first. Runs are interleaved (all sides each round) so drift on a shared machine hits
every side alike; medians and minimums are reported.

Usage: python bench/bench_startup.py [--runs N] [--synthetic N] [--baseline REF]   (with the venv's interpreter; it
measures the nrl_shim that interpreter imports: the installed one, or this checkout with PYTHONPATH=.)
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

EXAMPLE_PLUGIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "quirk-plugin")
HEAVY = ("torch", "vllm", "transformers", "numpy", "wrapt", "ray", "packaging", "importlib.metadata", "logging")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SYNTHETIC = '''"""Synthetic quirk {i} for bench/bench_startup.py (exists only in the benchmark's copy of the package): shaped like a
real quirk module, with targets that are never imported."""

from ..settings import Variable, parse_bool

ID = "synthetic-quirk-{i:02d}"
SUMMARY = "synthetic quirk {i}: wraps a function of a module nobody imports"
LINK = "https://example.invalid/nrl-shim/synthetic/{i}"
LIBRARY = "vllm"
VERSIONS = ">=0.8.5"  # a literal: the same module serves the baseline layout (before quirks/vllm/)
TARGETS = ("nrl_shim_bench_absent_{i:02d}.engine", "nrl_shim_bench_absent_{i:02d}.worker")
SETTINGS = (
    Variable(
        "NRL_SHIM_SYNTHETIC_{i:02d}",
        "synthetic_{i:02d}",
        parse_bool,
        True,
        "`1` / `0`",
        "synthetic setting {i} (benchmark only)",
    ),
)


def _guard(wrapped, instance, args, kwargs):
    if args and args[0] is None:
        from ..errors import UnsupportedConfigError

        raise UnsupportedConfigError(f"[{{ID}}] synthetic check {i} refused None; NRL_SHIM_DISABLE={{ID}} skips it")
    return wrapped(*args, **kwargs)


def patch(module, settings):
    from ..patching import wrap

    if getattr(settings, "synthetic_{i:02d}"):
        wrap(module, "run", _guard, ID)


def unpatch(module):
    from ..patching import unwrap

    unwrap(module, "run", ID)


def describe(settings, version):
    return f"synthetic quirk {i}: " + ("on" if getattr(settings, "synthetic_{i:02d}") else "off")
'''


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NRL_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


def _run(cmd, env, **kw):
    return subprocess.run(cmd, env=env, check=True, **kw)


def make_tree(root, package_dir=None, ref=None, synthetic=0):
    """A copy of nrl_shim under root (from package_dir, or `git archive ref`), with `synthetic` extra quirks, compiled."""
    os.makedirs(root)
    if ref is None:
        shutil.copytree(package_dir, os.path.join(root, "nrl_shim"), ignore=shutil.ignore_patterns("__pycache__"))
    else:
        archive = subprocess.run(["git", "-C", REPO, "archive", ref, "nrl_shim"], check=True, capture_output=True)
        _run(["tar", "-x", "-C", root], None, input=archive.stdout)
    if synthetic and os.path.isfile(os.path.join(root, "nrl_shim", "plugins.py")):
        # Built-ins are pyproject.toml's entry points: declare today's and the synthetic ones beside the copy.
        quirks = os.path.join(root, "nrl_shim", "quirks")
        lines = []
        for i in range(synthetic):
            with open(os.path.join(quirks, f"synthetic_{i:02d}.py"), "w") as f:
                f.write(SYNTHETIC.format(i=i))
            lines.append(f'"synthetic-quirk-{i:02d}" = "nrl_shim.quirks.synthetic_{i:02d}"')
        if ref is None:
            with open(os.path.join(REPO, "pyproject.toml")) as f:
                source = f.read()
        else:  # the entry points of that revision: its modules may live elsewhere (before quirks/<library>/)
            shown = subprocess.run(
                ["git", "-C", REPO, "show", f"{ref}:pyproject.toml"], check=True, capture_output=True
            )
            source = shown.stdout.decode()
        table = '[project.entry-points."nrl_shim.quirks"]\n'
        if table not in source:
            raise SystemExit("pyproject.toml: no nrl_shim.quirks entry points to add synthetic quirks to")
        with open(os.path.join(root, "pyproject.toml"), "w") as f:
            f.write(source.replace(table, table + "\n".join(lines) + "\n"))
        regenerate = "from nrl_shim import docs; docs.write_quirk_index()"
        _run([sys.executable, "-c", regenerate], _env(PYTHONPATH=root, NRL_SHIM="0"), cwd=root)
    elif synthetic:
        quirks = os.path.join(root, "nrl_shim", "quirks")
        names = []
        for i in range(synthetic):
            with open(os.path.join(quirks, f"synthetic_{i:02d}.py"), "w") as f:
                f.write(SYNTHETIC.format(i=i))
            names.append(f"nrl_shim.quirks.synthetic_{i:02d}")
        registry = os.path.join(root, "nrl_shim", "registry.py")
        with open(registry) as f:
            source = f.read()
        source, found = re.subn(
            r"^QUIRK_MODULES = \(\n", lambda m: m.group(0) + "".join(f'    "{n}",\n' for n in names), source, flags=re.M
        )
        if found != 1:
            raise SystemExit(f"{registry}: no `QUIRK_MODULES = (` to register synthetic quirks in")
        with open(registry, "w") as f:
            f.write(source)
        # Trees with a quirk index (generated from QUIRK_MODULES) get it regenerated; older trees have none.
        regenerate = "from nrl_shim import docs\nif hasattr(docs, 'write_quirk_index'): docs.write_quirk_index()"
        _run([sys.executable, "-c", regenerate], _env(PYTHONPATH=root, NRL_SHIM="0"), cwd=root)
    _own_dist_info(root, ref)
    # As pip does (uv needs --compile-bytecode): start-up is measured against compiled modules.
    _run([sys.executable, "-m", "compileall", "-q", os.path.join(root, "nrl_shim")], _env())
    return root


def _own_dist_info(root, ref):
    """An nrl-shim dist-info beside the copy, with the entry points of that tree's pyproject.toml (the synthetic ones
    included): first on PYTHONPATH, it shadows the interpreter's installed nrl-shim, whose entry points name the
    modules of *its* layout. Without it an older tree would take the installed built-ins for plugins it cannot
    import (one warning and one failed import each, at every start)."""
    import tomllib

    path = os.path.join(root, "pyproject.toml")
    if os.path.isfile(path):
        with open(path, "rb") as f:
            project = tomllib.load(f)["project"]
    else:
        show = ["git", "-C", REPO, "show", f"{ref or 'HEAD'}:pyproject.toml"]
        project = tomllib.loads(subprocess.run(show, check=True, capture_output=True).stdout.decode())["project"]
    dist_info = os.path.join(root, "nrl_shim-0.0.0.dist-info")
    os.makedirs(dist_info, exist_ok=True)
    with open(os.path.join(dist_info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: nrl-shim\nVersion: 0.0.0\n")
    with open(os.path.join(dist_info, "entry_points.txt"), "w") as f:
        for group, entries in project.get("entry-points", {}).items():
            f.write(f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in entries.items()) + "\n")


def install_plugin(root):
    """examples/quirk-plugin installed into `root` as installers do (dist-info with its entry point)."""
    uv = shutil.which("uv")
    if uv:
        cmd = [uv, "pip", "install", "--quiet", "--no-deps", "--target", root, "--python", sys.executable]
    else:
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", root]
    source = os.path.join(os.path.dirname(root), "plugin-src")  # a copy: the build writes beside its sources
    shutil.copytree(EXAMPLE_PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    _run([*cmd, source], _env())
    _run([sys.executable, "-m", "compileall", "-q", os.path.join(root, "nrl_shim_example_quirks")], _env())


def scan_cost(py, runs):
    """(import importlib.metadata, entry_points(group=...)) in ms, medians over fresh interpreters; and how many
    distributions this interpreter has."""
    probe = (
        "import time, json; t = time.perf_counter(); import importlib.metadata as m; t1 = time.perf_counter(); "
        "m.entry_points(group='nrl_shim.quirks'); t2 = time.perf_counter(); "
        "print(json.dumps([t1 - t, t2 - t1, len(list(m.distributions()))]))"
    )
    rows = [json.loads(subprocess.run([py, "-c", probe], env=_env(), capture_output=True, text=True).stdout)]
    rows += [
        json.loads(subprocess.run([py, "-c", probe], env=_env(), capture_output=True, text=True).stdout)
        for _ in range(runs - 1)
    ]
    return statistics.median(r[0] for r in rows) * 1e3, statistics.median(r[1] for r in rows) * 1e3, rows[0][2]


def _wall(cmd, env):
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def interleaved(sides, runs):
    """{label: [seconds, ...]} for sides {label: (cmd, env)}, every side once per round, the order rotating."""
    times = {label: [] for label in sides}
    labels = list(sides)
    for r in range(runs):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            times[label].append(_wall(*sides[label]))
    return times


def importtime(py, root, runs):
    """(median cumulative import time of nrl_shim in µs, nrl_shim modules loaded) at start-up with NRL_SHIM=1."""
    totals, modules = [], 0
    for _ in range(runs):
        err = subprocess.run(
            [py, "-X", "importtime", "-c", "pass"],
            env=_env(PYTHONPATH=root, NRL_SHIM="1"),
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        rows = [line.split("|") for line in err.splitlines() if line.startswith("import time:") and "|" in line]
        ours = [(int(cumulative), name.strip()) for _self, cumulative, name in rows[1:] if "nrl_shim" in name]
        totals.append(next((c for c, name in ours if name == "nrl_shim"), 0))
        modules = len(ours)
    return statistics.median(totals), modules


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--synthetic", type=int, default=30, help="synthetic quirks in the second tree (0: none)")
    parser.add_argument("--baseline", metavar="REF", help="also measure this git revision of the repository")
    parser.add_argument(
        "--torch-runs", type=int, help="runs per side of section 4 (default runs/2, at least 10; 0: skip)"
    )
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # each figure as soon as it is measured, also into a pipe or file
    py = sys.executable
    package_dir = os.path.dirname(importlib.util.find_spec("nrl_shim").origin)
    print(f"nrl_shim under test: {package_dir}; interpreter {py}")
    if not any(os.path.isfile(os.path.join(d, "nrl_shim.pth")) for d in __import__("site").getsitepackages()):
        raise SystemExit("this interpreter has no nrl_shim.pth in site-packages: `pip install .` into its venv first")

    metadata_ms, scan_ms, dists = scan_cost(py, 5)
    print(
        f"0. without a cached index every start would pay: import importlib.metadata {metadata_ms:.1f} ms + "
        f"entry_points(group=...) {scan_ms:.1f} ms over {dists} distributions (medians of 5)"
    )

    with tempfile.TemporaryDirectory() as tmp:
        trees = {"now": make_tree(os.path.join(tmp, "now"), package_dir)}
        plugins = os.path.isfile(os.path.join(package_dir, "plugins.py"))
        if plugins:
            trees["now+plugin"] = make_tree(os.path.join(tmp, "plugin"), package_dir)
            install_plugin(trees["now+plugin"])
        if args.synthetic:
            trees[f"now+{args.synthetic}"] = make_tree(os.path.join(tmp, "syn"), package_dir, synthetic=args.synthetic)
        if args.baseline:
            trees[args.baseline] = make_tree(os.path.join(tmp, "base"), ref=args.baseline)
            if args.synthetic:
                trees[f"{args.baseline}+{args.synthetic}"] = make_tree(
                    os.path.join(tmp, "base-syn"), ref=args.baseline, synthetic=args.synthetic
                )
        cmd = [py, "-c", "pass"]
        caches = {label: os.path.join(tmp, f"cache-{i}") for i, label in enumerate(trees)}
        # The unset side has a tree on PYTHONPATH too: an extra sys.path entry is part of the comparison, not the shim.
        sides = {"unset": (cmd, _env(PYTHONPATH=trees.get("now+plugin", trees["now"])))}
        sides.update(
            {
                label: (cmd, _env(PYTHONPATH=root, NRL_SHIM="1", XDG_CACHE_HOME=caches[label]))
                for label, root in trees.items()
            }
        )
        # A setting set (here the log level at its default): start-up validates it, so it activates at once instead of
        # arming (nrl_shim/_startup.py); trees without an armed start-up do that anyway.
        set_env = _env(PYTHONPATH=trees["now"], NRL_SHIM="1", XDG_CACHE_HOME=caches["now"], NRL_SHIM_LOG_LEVEL="INFO")
        sides["now, a setting set"] = (cmd, set_env)
        probe = "import sys; m = sys.modules.get('nrl_shim'); assert m and m.is_active(), 'not active'"
        for label, root in trees.items():  # each tree really activates (and fails loudly here otherwise)
            _run([py, "-c", probe], _env(PYTHONPATH=root, NRL_SHIM="1", XDG_CACHE_HOME=caches[label]))
        if plugins:
            check = (
                "from nrl_shim import registry; assert 'vllm-use-inductor' in registry.quirk_ids(), 'plugin not found'"
            )
            _run([py, "-c", check], _env(PYTHONPATH=trees["now+plugin"], XDG_CACHE_HOME=caches["now+plugin"]))
        interleaved(sides, 3)  # warm-up: page cache, pyc reads
        times = interleaved(sides, args.runs)
        bare, bare_min = statistics.median(times["unset"]), min(times["unset"])
        print(f"1. interpreter start, {args.runs} interleaved runs per side (median / min):")
        print(f"   {'NRL_SHIM unset':<30} {bare * 1e3:6.2f} / {bare_min * 1e3:6.2f} ms")
        for label in [*trees, "now, a setting set"]:
            med, low = statistics.median(times[label]), min(times[label])
            print(
                f"   NRL_SHIM=1 {label:<19} {med * 1e3:6.2f} / {low * 1e3:6.2f} ms -> "
                f"+{(med - bare) * 1e3:.2f} ms median, +{(low - bare_min) * 1e3:.2f} ms min, ratio {med / bare:.3f} "
                "(goal <= +2 ms)"
            )

        if plugins:
            # The first start after an install: the stamp differs (a directory's mtime), one scan, the index rewritten.
            root, stale = trees["now+plugin"], []
            env = _env(PYTHONPATH=root, NRL_SHIM="1", XDG_CACHE_HOME=caches["now+plugin"])
            for _ in range(5):
                os.utime(root)  # as an install or removal in that directory does
                stale.append(_wall(cmd, env))
            print(
                f"   first start after an install/removal (one scan, index rewritten): "
                f"{statistics.median(stale) * 1e3:6.2f} ms median of 5 -> +{(statistics.median(stale) - bare) * 1e3:.1f} ms"
            )

        print("2. python -X importtime -c pass with NRL_SHIM=1 (median cumulative of `nrl_shim`):")
        for label, root in trees.items():
            micros, modules = importtime(py, root, max(5, args.runs // 4))
            print(f"   {label:<12} {micros / 1e3:5.2f} ms, {modules} nrl_shim modules loaded")

        probe = (
            "import sys, time, json; t = time.perf_counter(); import nrl_shim; dt = time.perf_counter() - t; "
            f"print(json.dumps([dt, [m for m in {HEAVY!r} if m in sys.modules], "
            "sorted(m for m in sys.modules if m.startswith('nrl_shim.quirks.'))]))"
        )
        samples, pulled, quirk_modules = [], None, None
        for _ in range(max(5, args.runs // 4)):
            out = subprocess.run(
                [py, "-c", probe], env=_env(PYTHONPATH=trees["now"]), capture_output=True, text=True, check=True
            ).stdout
            dt, pulled, quirk_modules = json.loads(out)
            samples.append(dt)
        print(
            f"3. import nrl_shim: {statistics.median(samples) * 1e3:.2f} ms; heavy modules pulled in: "
            f"{', '.join(pulled) or 'none'} (goal: none of torch, vllm, transformers, numpy); quirk modules loaded: "
            f"{', '.join(quirk_modules) or 'none'}"
        )

        runs = max(10, args.runs // 2) if args.torch_runs is None else args.torch_runs
        if importlib.util.find_spec("torch") is None or runs == 0:
            print("4. import torch: skipped (torch not installed, or --torch-runs 0)")
            return
        print(f"4. import torch: {runs} interleaved runs per side ...")
        torch_cmd = [py, "-c", "import torch"]
        hooks = interleaved(
            {
                "none": (torch_cmd, _env(PYTHONPATH=trees["now"], NRL_SHIM="0")),
                "hooks": (torch_cmd, _env(PYTHONPATH=trees["now"], NRL_SHIM="1")),
            },
            runs,
        )
        bare_torch, hooked = statistics.median(hooks["none"]), statistics.median(hooks["hooks"])
        print(
            f"4. import torch: no hooks {bare_torch * 1e3:.0f} ms, hooks registered {hooked * 1e3:.0f} ms "
            f"-> ratio {hooked / bare_torch:.3f} (goal <= 1.02)"
        )


if __name__ == "__main__":
    main()
