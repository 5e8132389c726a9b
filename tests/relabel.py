"""A release with a higher number, made from the one installed: the tests' way to run "the day after the next release"
(tests/test_version_policy.py). relabeled_venv() builds a venv whose site-packages is this interpreter's, entry by
entry as symbolic links, except one distribution relabeled: its dist-info copied under the new version (METADATA's
Version, the directory name, RECORD's paths), and the package files that carry the version (vllm/_version.py,
torch/version.py) rewritten. The code is the installed code, byte for byte, unless `edits` changes a file (to take
away something a fix needs). Nothing in the original venv is written: edited files are new files in the new tree, and
the directories above them are real directories of links. About a second and a few MB per venv.
"""

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

# The files of a package that hold its version, and how to rewrite them.
VERSION_FILES = {
    "vllm": (
        "_version.py",
        [
            (r"__version__ = version = '[^']*'", "__version__ = version = '{version}'"),
            (r"__version_tuple__ = version_tuple = \([^)]*\)", "__version_tuple__ = version_tuple = {version_tuple}"),
        ],
    ),
    "torch": ("version.py", [(r"__version__ = '[^']*'", "__version__ = '{version}'")]),
}


def _dist_info(site, distribution):
    prefix = distribution.replace("-", "_").lower() + "-"
    found = [p for p in site.iterdir() if p.name.lower().startswith(prefix) and p.name.endswith(".dist-info")]
    assert len(found) == 1, f"{distribution}: {found}"
    return found[0]


def _materialize(root, relative, source_root):
    """Make root/relative a real file or directory: every directory on the way becomes a real directory whose other
    entries are links to the source tree's. Returns the path under root."""
    current, source = root, source_root
    for part in Path(relative).parts:
        if current.is_symlink() or not current.exists():
            raise AssertionError(f"{current} should be a real directory by now")
        entry, source = current / part, source / part
        if entry.is_symlink():
            entry.unlink()
            if source.is_dir():
                entry.mkdir()
                for child in source.iterdir():
                    if child.name == "__pycache__":  # a real one: a new .pyc must not land in the original's
                        (entry / child.name).mkdir()
                        for cached in child.iterdir():
                            (entry / child.name / cached.name).symlink_to(cached)
                    else:
                        (entry / child.name).symlink_to(child)
            else:
                shutil.copyfile(source, entry)  # a new file: the original is never opened for writing
        current = entry
    return current


def relabeled_venv(dest, distribution, package, version, edits=None):
    """A venv at `dest` where `distribution` (importable as `package`) reads as `version`. `edits`: {path under
    site-packages: function(text) -> text}. Returns the new interpreter's path."""
    dest = Path(dest)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = Path(sysconfig.get_paths()["purelib"])
    new_site = Path(
        subprocess.run(
            [str(dest / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    info = _dist_info(site, distribution)
    for entry in site.iterdir():
        if entry != info:
            (new_site / entry.name).symlink_to(entry)
    # The dist-info under the new version: small text files, copied and edited.
    old_version = info.name[len(distribution) + 1 : -len(".dist-info")]
    new_info = new_site / info.name.replace(old_version, version)
    shutil.copytree(info, new_info, symlinks=True)
    metadata = new_info / "METADATA"
    metadata.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}", metadata.read_text(), count=1))
    record = new_info / "RECORD"
    if record.exists():
        record.write_text(record.read_text().replace(info.name, new_info.name))
    # The package's own version.
    name, patterns = VERSION_FILES[package]
    parts = tuple(int(p) if p.isdigit() else p for p in version.split("."))

    def relabel(text):
        for pattern, template in patterns:
            text, n = re.subn(pattern, template.format(version=version, version_tuple=parts), text)
            assert n == 1, f"{package}/{name}: {pattern!r} not found"
        return text

    for relative, edit in {f"{package}/{name}": relabel, **(edits or {})}.items():
        path = _materialize(new_site, relative, site)
        path.write_text(edit(path.read_text()))
        for cached in (path.parent / "__pycache__").glob(path.stem + ".*.pyc"):
            cached.unlink()  # a link to the original's compiled file: this tree compiles its own
    # The console script the tests call (nrl-shim run), for this interpreter.
    script = Path(sys.executable).parent / "nrl-shim"
    if script.exists():
        text = script.read_text().split("\n", 1)[1]
        (dest / "bin" / "nrl-shim").write_text(f"#!{dest / 'bin' / 'python'}\n{text}")
        (dest / "bin" / "nrl-shim").chmod(0o755)
    return str(dest / "bin" / "python")
