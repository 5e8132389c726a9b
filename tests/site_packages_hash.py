"""Content hashes of the files a Python interpreter has installed (its site-packages), taken before and after a run, to
show that a run (a test harness, the shim, a framework under it) edited no installed file of a third party.

    before = snapshot(python)
    ...run...
    assert differences(before, snapshot(python)) == []

Bytecode caches (`__pycache__/`) are left out: the interpreter writes them itself and they are not edits. A file that
is added, removed or changed in content shows up, whatever its modification time says.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

_CHUNK = 1 << 20


def site_packages(python: str = sys.executable) -> list[str]:
    """The site-packages folders of interpreter `python` (purelib and platlib; usually one)."""
    code = "import json, sysconfig; p = sysconfig.get_paths(); print(json.dumps(sorted({p['purelib'], p['platlib']})))"
    out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, check=True).stdout
    return [path for path in json.loads(out) if os.path.isdir(path)]


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def snapshot(python: str = sys.executable, roots: list[str] | None = None) -> dict[str, str]:
    """{path: sha256} of every file under `roots` (default: site_packages(python)), bytecode caches left out; a
    symbolic link is recorded by its target instead of hashed."""
    hashes = {}
    for root in roots if roots is not None else site_packages(python):
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                path = os.path.join(folder, name)
                hashes[path] = "link:" + os.readlink(path) if os.path.islink(path) else file_sha256(path)
    return hashes


def differences(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What changed between two snapshots, one line per file ("changed: PATH", "added: PATH", "removed: PATH"),
    sorted; [] when nothing did."""
    lines = [f"changed: {p}" for p in before.keys() & after.keys() if before[p] != after[p]]
    lines += [f"added: {p}" for p in after.keys() - before.keys()]
    lines += [f"removed: {p}" for p in before.keys() - after.keys()]
    return sorted(lines, key=lambda line: line.split(": ", 1)[1])
