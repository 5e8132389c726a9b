"""Check the built wheel and sdist against what a release must hold (run by `nox -s package` after `python -m build`).

    python tools/check_dist.py [--root CHECKOUT] PATH [PATH ...]

PATH: a .whl, a .tar.gz sdist, or a directory holding exactly one of each. What is expected comes from the checkout
(--root, default: this file's repository): pyproject.toml and the version in nrl_shim/__init__.py.

The wheel: nrl_shim/__init__.py, _quirk_index.py, py.typed and the module of every `nrl_shim.quirks` entry point;
nrl_shim.pth at its root (the checkout's bytes); the LICENSE files in *.dist-info/licenses/; entry_points.txt with
pyproject's scripts and `nrl_shim.quirks` group; METADATA with the name, version, Requires-Python, dependencies,
license expression, classifiers and Project-URLs of pyproject; nothing else at its root (no tests/, bench/...), no
.pyc, no __pycache__. The sdist: LICENSE, CHANGELOG.md, README.md, pyproject.toml, PKG-INFO, the package and
nrl_shim.pth (a wheel is built from it); no caches, venvs, VCS data or job records.

Prints each check; exits 1 naming every problem, 0 when there is none. Stdlib only (tomli where Python < 3.11; pytest
brings it), so tests/test_check_dist.py runs it in the plain unit sessions.
"""

from __future__ import annotations

import argparse
import configparser
import email.parser
import os
import re
import sys
import tarfile
import zipfile

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef,unused-ignore]

PACKAGE = "nrl_shim"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SDIST_MUST_HOLD = ("LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "PKG-INFO", "nrl_shim.pth")
# Path parts no artifact may hold: caches, venvs, VCS data, the job report's records (nrl_shim/job_report.py).
FORBIDDEN_PARTS = (
    "__pycache__",
    ".nox",
    ".git",
    ".pytest_cache",
    ".hypothesis",
    ".mypy_cache",
    ".ruff_cache",
    ".venv",
    "jobs",
)


class Expected:
    """What the artifacts must say, read from a checkout."""

    def __init__(self, root: str) -> None:
        with open(os.path.join(root, "pyproject.toml"), "rb") as f:
            self.pyproject = tomllib.load(f)
        project = self.pyproject["project"]
        self.name: str = project["name"]
        with open(os.path.join(root, PACKAGE, "__init__.py"), encoding="utf-8") as f:
            found = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', f.read(), re.M)
        if not found:
            raise SystemExit(f"check_dist: no __version__ in {os.path.join(root, PACKAGE, '__init__.py')}")
        self.version: str = found.group(1)
        self.requires_python: str = project["requires-python"]
        self.dependencies: list[str] = list(project.get("dependencies", []))
        self.classifiers: list[str] = list(project.get("classifiers", []))
        self.urls: dict[str, str] = dict(project.get("urls", {}))
        self.scripts: dict[str, str] = dict(project.get("scripts", {}))
        self.quirks: dict[str, str] = dict(project.get("entry-points", {}).get("nrl_shim.quirks", {}))
        self.license = project.get("license")
        self.license_files: dict[str, bytes] = {}
        for name in project.get("license-files", []):
            with open(os.path.join(root, name), "rb") as f:
                self.license_files[os.path.basename(name)] = f.read()
        with open(os.path.join(root, "nrl_shim.pth"), "rb") as f:
            self.pth = f.read()
        self.typed = os.path.exists(os.path.join(root, PACKAGE, "py.typed"))
        self.stem = f"{re.sub(r'[-_.]+', '_', self.name).lower()}-{self.version}"


def _module_files(module: str) -> tuple[str, str]:
    base = module.replace(".", "/")
    return f"{base}.py", f"{base}/__init__.py"


def _forbidden(path: str) -> str | None:
    parts = path.strip("/").split("/")
    for part in parts:
        if part in FORBIDDEN_PARTS:
            return part
    if path.endswith((".pyc", ".pyo")):
        return ".pyc"
    return None


def _check_metadata(text: str, exp: Expected, where: str, checked: list[str], problems: list[str]) -> None:
    meta = email.parser.Parser().parsestr(text)

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    if norm(meta.get("Name", "")) != norm(exp.name):
        problems.append(f"{where}: Name is {meta.get('Name')!r}, not {exp.name!r}")
    if meta.get("Version") != exp.version:
        problems.append(f"{where}: Version is {meta.get('Version')!r}, not {exp.version!r} (nrl_shim/__init__.py)")
    if meta.get("Requires-Python") != exp.requires_python:
        problems.append(f"{where}: Requires-Python is {meta.get('Requires-Python')!r}, not {exp.requires_python!r}")
    requires = {re.sub(r"\s+", "", r) for r in meta.get_all("Requires-Dist") or []}
    for dep in exp.dependencies:
        if re.sub(r"\s+", "", dep) not in requires:
            problems.append(f"{where}: Requires-Dist lacks {dep!r}")
    classifiers = meta.get_all("Classifier") or []
    missing = [c for c in exp.classifiers if c not in classifiers]
    extra = [c for c in classifiers if c not in exp.classifiers]
    if missing:
        problems.append(f"{where}: classifiers missing: {missing}")
    if extra:
        problems.append(f"{where}: classifiers not in pyproject.toml: {extra}")
    if not exp.classifiers:
        problems.append("pyproject.toml declares no classifiers")
    urls = dict(
        (label.strip(), url.strip()) for label, _, url in (u.partition(",") for u in meta.get_all("Project-URL") or [])
    )
    for label, url in exp.urls.items():
        if urls.get(label) != url:
            problems.append(f"{where}: Project-URL {label!r} is {urls.get(label)!r}, not {url!r}")
    if not exp.urls:
        problems.append("pyproject.toml declares no [project.urls]")
    if isinstance(exp.license, str):  # PEP 639: an SPDX expression, and no license classifier beside it
        if meta.get("License-Expression") != exp.license:
            problems.append(f"{where}: License-Expression is {meta.get('License-Expression')!r}, not {exp.license!r}")
        if any(c.startswith("License ::") for c in classifiers):
            problems.append(f"{where}: a License classifier beside a license expression (PEP 639 forbids it)")
        files = meta.get_all("License-File") or []
        for name in exp.license_files:
            if name not in files:
                problems.append(f"{where}: no License-File: {name}")
    elif not any(c.startswith("License ::") for c in classifiers):
        problems.append(f"{where}: no license expression and no License classifier")
    checked.append(
        f"{where}: name, version {exp.version}, Requires-Python {exp.requires_python}, {len(exp.dependencies)} "
        f"dependencies, license, {len(exp.classifiers)} classifiers, {len(exp.urls)} Project-URLs"
    )


def check_wheel(path: str, exp: Expected) -> tuple[list[str], list[str]]:
    """(what was checked, problems) for one wheel."""
    checked: list[str] = []
    problems: list[str] = []
    where = os.path.basename(path)
    if not where.startswith(f"{exp.stem}-") or not where.endswith(".whl"):
        problems.append(f"{where}: the file name does not start with {exp.stem}- (name and version)")
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        return checked, [f"{where}: not a readable zip: {e}"]
    with zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        dist_info = f"{exp.stem}.dist-info"

        def read(name: str) -> bytes | None:
            try:
                return zf.read(name)
            except KeyError:
                return None

        # The package's files.
        must = [f"{PACKAGE}/__init__.py", f"{PACKAGE}/_quirk_index.py"] + ([f"{PACKAGE}/py.typed"] if exp.typed else [])
        for target in exp.scripts.values():
            must.append(_module_files(target.partition(":")[0])[0])
        for name in must:
            if name not in names:
                problems.append(f"{where}: no {name}")
        for qid, module in exp.quirks.items():
            if not any(f in names for f in _module_files(module)):
                problems.append(f"{where}: no module {module} (quirk {qid}; {_module_files(module)[0]})")
        checked.append(f"{where}: {len(must)} package files and the modules of {len(exp.quirks)} quirks")

        # The .pth at the root.
        pth = read("nrl_shim.pth")
        if pth is None:
            problems.append(f"{where}: no nrl_shim.pth at the root")
        elif pth != exp.pth:
            problems.append(f"{where}: nrl_shim.pth differs from the checkout's")
        checked.append(f"{where}: nrl_shim.pth at the root, as in the checkout")

        # dist-info: license, entry points, metadata, record.
        if not any(n.startswith(f"{dist_info}/") for n in names):
            problems.append(f"{where}: no {dist_info}/")
        for name, content in exp.license_files.items():
            found = [n for n in names if n.startswith(f"{dist_info}/") and n.rsplit("/", 1)[-1] == name]
            if not found:
                problems.append(f"{where}: no {name} in {dist_info}/ (e.g. {dist_info}/licenses/{name})")
            elif zf.read(found[0]) != content:
                problems.append(f"{where}: {found[0]} differs from the checkout's {name}")
        if not exp.license_files:
            problems.append("pyproject.toml declares no license-files")
        checked.append(f"{where}: license files {sorted(exp.license_files)} in {dist_info}/")

        raw = read(f"{dist_info}/entry_points.txt")
        if raw is None:
            problems.append(f"{where}: no {dist_info}/entry_points.txt")
        else:
            eps = configparser.ConfigParser(delimiters=("=",), interpolation=None)
            eps.optionxform = str  # type: ignore[assignment,method-assign]  # keep the names' case
            eps.read_string(raw.decode("utf-8"))
            for group, wanted in (("console_scripts", exp.scripts), ("nrl_shim.quirks", exp.quirks)):
                have = {k: v.strip() for k, v in eps.items(group)} if eps.has_section(group) else None
                if have is None:
                    problems.append(f"{where}: entry_points.txt has no [{group}] group")
                elif have != wanted:
                    lost = sorted(set(wanted.items()) - set(have.items()))
                    more = sorted(set(have.items()) - set(wanted.items()))
                    problems.append(f"{where}: entry_points.txt [{group}] differs: missing {lost}, extra {more}")
            checked.append(
                f"{where}: entry points: scripts {sorted(exp.scripts)}, {len(exp.quirks)} in nrl_shim.quirks"
            )

        raw = read(f"{dist_info}/METADATA")
        if raw is None:
            problems.append(f"{where}: no {dist_info}/METADATA")
        else:
            _check_metadata(raw.decode("utf-8"), exp, f"{where} METADATA", checked, problems)
        for name in ("WHEEL", "RECORD"):
            if read(f"{dist_info}/{name}") is None:
                problems.append(f"{where}: no {dist_info}/{name}")

        # Nothing else.
        allowed_roots = {PACKAGE, dist_info, "nrl_shim.pth"}
        stray = sorted({n.split("/", 1)[0] for n in names} - allowed_roots)
        if stray:
            problems.append(f"{where}: unexpected at the wheel's root: {stray} (only {sorted(allowed_roots)})")
        for name in names:
            bad = _forbidden(name)
            if bad:
                problems.append(f"{where}: holds {name} ({bad})")
        checked.append(f"{where}: {len(names)} files; nothing but the package, nrl_shim.pth and dist-info; no caches")
    return checked, problems


def check_sdist(path: str, exp: Expected) -> tuple[list[str], list[str]]:
    """(what was checked, problems) for one sdist."""
    checked: list[str] = []
    problems: list[str] = []
    where = os.path.basename(path)
    if where != f"{exp.stem}.tar.gz":
        problems.append(f"{where}: the file name is not {exp.stem}.tar.gz (name and version)")
    try:
        tf = tarfile.open(path, "r:gz")
    except (OSError, tarfile.TarError) as e:
        return checked, [f"{where}: not a readable .tar.gz: {e}"]
    with tf:
        members = tf.getmembers()
        names = [m.name for m in members]
        top = {n.split("/", 1)[0] for n in names}
        if top != {exp.stem}:
            problems.append(f"{where}: everything should be under {exp.stem}/, found {sorted(top)}")
        inner = {n.split("/", 1)[1] for n in names if "/" in n}
        for name in (*SDIST_MUST_HOLD, f"{PACKAGE}/__init__.py"):
            if name not in inner:
                problems.append(f"{where}: no {name}")
        for qid, module in exp.quirks.items():
            if not any(f in inner for f in _module_files(module)):
                problems.append(f"{where}: no module {module} (quirk {qid})")
        checked.append(
            f"{where}: {', '.join(SDIST_MUST_HOLD)}, the package and the modules of {len(exp.quirks)} quirks"
        )
        for name, content in exp.license_files.items():
            member = f"{exp.stem}/{name}"
            f = tf.extractfile(member) if member in names else None
            if f is not None and f.read() != content:
                problems.append(f"{where}: {name} differs from the checkout's")
        for name in sorted(inner):
            bad = _forbidden(name)
            if bad:
                problems.append(f"{where}: holds {name} ({bad})")
        checked.append(f"{where}: {len(inner)} entries; no caches, venvs, VCS data or job records")
        info = f"{exp.stem}/PKG-INFO"
        f = tf.extractfile(info) if info in names else None
        if f is not None:
            _check_metadata(f.read().decode("utf-8"), exp, f"{where} PKG-INFO", checked, problems)
    return checked, problems


def _artifacts(paths: list[str]) -> tuple[list[str], list[str], list[str]]:
    wheels: list[str] = []
    sdists: list[str] = []
    problems: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            entries = sorted(os.path.join(path, n) for n in os.listdir(path))
            found_w = [e for e in entries if e.endswith(".whl")]
            found_s = [e for e in entries if e.endswith(".tar.gz")]
            if len(found_w) != 1 or len(found_s) != 1:
                problems.append(f"{path}: expected one wheel and one sdist, found {len(found_w)} and {len(found_s)}")
            wheels += found_w
            sdists += found_s
        elif path.endswith(".whl"):
            wheels.append(path)
        elif path.endswith(".tar.gz"):
            sdists.append(path)
        else:
            problems.append(f"{path}: neither a .whl, a .tar.gz nor a directory")
    if not wheels and not sdists:
        problems.append("nothing to check")
    return wheels, sdists, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--root", default=ROOT, help="the checkout the artifacts were built from (default: %(default)s)"
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a .whl, a .tar.gz, or a directory with one of each")
    args = parser.parse_args(argv)
    exp = Expected(args.root)
    wheels, sdists, problems = _artifacts(args.paths)
    checked: list[str] = []
    for path in wheels:
        c, p = check_wheel(path, exp)
        checked += c
        problems += p
    for path in sdists:
        c, p = check_sdist(path, exp)
        checked += c
        problems += p
    for path in wheels + sdists:
        print(f"check_dist: {os.path.basename(path)}: {os.path.getsize(path) / 1024:.1f} KiB")
    for line in checked:
        print(f"check_dist: checked {line}")
    for line in problems:
        print(f"check_dist: PROBLEM: {line}")
    print(f"check_dist: {len(problems)} problem(s)" if problems else "check_dist: OK")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
