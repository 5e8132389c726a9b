"""tools/check_dist.py (run by `nox -s package` on the built wheel and sdist) on hand-made artifacts: a wheel and an
sdist made here from the checkout's declarations pass, and each kind of damage is named. Builds nothing."""

import importlib.util
import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_dist", ROOT / "tools" / "check_dist.py")
check_dist = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_dist)

EXP = check_dist.Expected(str(ROOT))
DIST_INFO = f"{EXP.stem}.dist-info"


def _metadata(version=EXP.version, classifiers=EXP.classifiers, urls=EXP.urls):
    lines = ["Metadata-Version: 2.4", f"Name: {EXP.name}", f"Version: {version}"]
    lines += [f"Project-URL: {label}, {url}" for label, url in urls.items()]
    if isinstance(EXP.license, str):
        lines.append(f"License-Expression: {EXP.license}")
    lines += [f"License-File: {name}" for name in EXP.license_files]
    lines += [f"Classifier: {c}" for c in classifiers]
    lines.append(f"Requires-Python: {EXP.requires_python}")
    lines += [f"Requires-Dist: {d}" for d in EXP.dependencies]
    return "\n".join(lines) + "\n\nREADME\n"


def _entry_points(quirks=EXP.quirks):
    text = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in EXP.scripts.items())
    return text + "\n[nrl_shim.quirks]\n" + "".join(f"{k} = {v}\n" for k, v in quirks.items())


def _wheel_files():
    files = {
        "nrl_shim/__init__.py": b"__version__ = 'x'\n",
        "nrl_shim/_quirk_index.py": b"",
        "nrl_shim/py.typed": b"",
        "nrl_shim/cli.py": b"",
        "nrl_shim.pth": EXP.pth,
        f"{DIST_INFO}/METADATA": _metadata().encode(),
        f"{DIST_INFO}/entry_points.txt": _entry_points().encode(),
        f"{DIST_INFO}/WHEEL": b"Wheel-Version: 1.0\n",
        f"{DIST_INFO}/RECORD": b"",
    }
    files.update({f"{DIST_INFO}/licenses/{n}": content for n, content in EXP.license_files.items()})
    files.update({check_dist._module_files(m)[0]: b"" for m in EXP.quirks.values()})
    return files


def _sdist_files():
    files = {name: b"" for name in check_dist.SDIST_MUST_HOLD}
    files.update({"nrl_shim/__init__.py": b"", "nrl_shim.pth": EXP.pth, "PKG-INFO": _metadata().encode()})
    files.update(EXP.license_files)
    files.update({check_dist._module_files(m)[0]: b"" for m in EXP.quirks.values()})
    return files


def _write_wheel(directory, files):
    path = os.path.join(directory, f"{EXP.stem}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as zf:
        for name, content in files.items():
            zf.writestr(name, content)
    return path


def _write_sdist(directory, files):
    path = os.path.join(directory, f"{EXP.stem}.tar.gz")
    with tarfile.open(path, "w:gz") as tf:
        for name, content in files.items():
            info = tarfile.TarInfo(f"{EXP.stem}/{name}")
            info.size = len(content)
            tf.addfile(info, io.BytesIO(content))
    return path


def test_hand_made_artifacts_pass(tmp_path, capsys):
    _write_wheel(tmp_path, _wheel_files())
    _write_sdist(tmp_path, _sdist_files())
    assert check_dist.main(["--root", str(ROOT), str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "check_dist: OK" in out
    assert f"modules of {len(EXP.quirks)} quirks" in out


def _first_quirk_module():
    return check_dist._module_files(next(iter(EXP.quirks.values())))[0]


WHEEL_DAMAGE = {
    "quirk module missing": (lambda f: f.pop(_first_quirk_module()), "no module"),
    "index missing": (lambda f: f.pop("nrl_shim/_quirk_index.py"), "no nrl_shim/_quirk_index.py"),
    "pth missing": (lambda f: f.pop("nrl_shim.pth"), "no nrl_shim.pth at the root"),
    "pth differs": (lambda f: f.update({"nrl_shim.pth": b"import os\n"}), "nrl_shim.pth differs"),
    "license missing": (lambda f: f.pop(f"{DIST_INFO}/licenses/LICENSE"), "no LICENSE in"),
    "tests shipped": (lambda f: f.update({"tests/test_x.py": b""}), "unexpected at the wheel's root: ['tests']"),
    "bytecode": (lambda f: f.update({"nrl_shim/__pycache__/cli.cpython-311.pyc": b""}), "(__pycache__)"),
    "stray pyc": (lambda f: f.update({"nrl_shim/cli.pyc": b""}), "(.pyc)"),
    "wrong version": (lambda f: f.update({f"{DIST_INFO}/METADATA": _metadata(version="9.9").encode()}), "Version is"),
    "classifier missing": (
        lambda f: f.update({f"{DIST_INFO}/METADATA": _metadata(classifiers=EXP.classifiers[1:]).encode()}),
        "classifiers missing",
    ),
    "url missing": (lambda f: f.update({f"{DIST_INFO}/METADATA": _metadata(urls={}).encode()}), "Project-URL"),
    "entry point missing": (
        lambda f: f.update({f"{DIST_INFO}/entry_points.txt": _entry_points(quirks={}).encode()}),
        "[nrl_shim.quirks] differs",
    ),
}


@pytest.mark.parametrize("damage", sorted(WHEEL_DAMAGE))
def test_damaged_wheel_is_named(tmp_path, capsys, damage):
    files = _wheel_files()
    change, expected = WHEEL_DAMAGE[damage]
    change(files)
    path = _write_wheel(tmp_path, files)
    assert check_dist.main(["--root", str(ROOT), path]) == 1
    problems = [line for line in capsys.readouterr().out.splitlines() if "PROBLEM" in line]
    assert problems and any(expected in line for line in problems), problems


SDIST_DAMAGE = {
    "changelog missing": (lambda f: f.pop("CHANGELOG.md"), "no CHANGELOG.md"),
    "license missing": (lambda f: f.pop("LICENSE"), "no LICENSE"),
    "nox venv": (lambda f: f.update({".nox/unit/bin/python": b""}), "(.nox)"),
    "bytecode": (lambda f: f.update({"tests/__pycache__/conftest.cpython-311.pyc": b""}), "(__pycache__)"),
    "job record": (lambda f: f.update({"jobs/vm-1.jsonl": b""}), "(jobs)"),
}


@pytest.mark.parametrize("damage", sorted(SDIST_DAMAGE))
def test_damaged_sdist_is_named(tmp_path, capsys, damage):
    files = _sdist_files()
    change, expected = SDIST_DAMAGE[damage]
    change(files)
    path = _write_sdist(tmp_path, files)
    assert check_dist.main(["--root", str(ROOT), path]) == 1
    problems = [line for line in capsys.readouterr().out.splitlines() if "PROBLEM" in line]
    assert problems and any(expected in line for line in problems), problems


def test_a_directory_needs_one_of_each(tmp_path, capsys):
    _write_wheel(tmp_path, _wheel_files())
    assert check_dist.main(["--root", str(ROOT), str(tmp_path)]) == 1
    assert "expected one wheel and one sdist, found 1 and 0" in capsys.readouterr().out
