"""sitecustomize_example/: the sitecustomize.py a user copies into an image that can't use nrl_shim.pth. Run for real:
an interpreter of a fresh venv (no nrl_shim.pth in its site-packages) where nrl_shim and its dependencies are
importable only through PYTHONPATH (a .pth there is never read), the example copied into a directory of its own in
front, and the image's own sitecustomize.py after it."""

import json
import os
import shutil
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

from conftest import SOURCE_ROOT, child_env

EXAMPLE = Path(SOURCE_ROOT) / "sitecustomize_example" / "sitecustomize.py"
PROBE = (
    "import json, os, sys; m = sys.modules.get('nrl_shim'); "
    "print(json.dumps({'sitecustomize': sys.modules['sitecustomize'].__file__, "
    "'image_hook_ran': os.environ.get('IMAGE_SITECUSTOMIZE_RAN'), 'active': bool(m and m.is_active())}))"
)


def test_example_is_the_package_bootstrap():
    from nrl_shim.docs import sitecustomize_example_source

    assert EXAMPLE.read_text() == sitecustomize_example_source(), "run `python -m nrl_shim.docs`"


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """A bare venv standing for the image's Python, its own sitecustomize.py, and the example copied as the README
    says: {python, example_dir, image_dir, deps}."""
    root = tmp_path_factory.mktemp("image")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root / "venv")
    python = root / "venv" / "bin" / "python"
    image_dir = root / "usr_lib"
    image_dir.mkdir()
    (image_dir / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITECUSTOMIZE_RAN'] = 'yes'\n")
    example_dir = root / "opt" / "nrl-shim-site"
    example_dir.mkdir(parents=True)
    shutil.copy(EXAMPLE, example_dir / "sitecustomize.py")
    # nrl_shim's dependencies (wrapt, packaging) from this interpreter's site-packages, read as a plain path entry.
    deps = sysconfig.get_paths()["purelib"]
    return {"python": python, "example_dir": example_dir, "image_dir": image_dir, "deps": deps}


def _run(image, *path, env=None, args=("-c", PROBE)):
    environ = child_env(env)
    environ["PYTHONPATH"] = os.pathsep.join(map(str, [*path, SOURCE_ROOT, image["deps"]]))
    proc = subprocess.run(
        [str(image["python"]), *args], env=environ, capture_output=True, text=True, timeout=120, cwd=image["image_dir"]
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_without_the_example_nrl_shim_env_does_nothing(image):
    # The failure the example is for: nrl_shim importable, NRL_SHIM=1, and yet no activation (no .pth is read).
    found = json.loads(_run(image, image["image_dir"], env={"NRL_SHIM": "1"}).stdout)
    assert found == {
        "sitecustomize": str(image["image_dir"] / "sitecustomize.py"),
        "image_hook_ran": "yes",
        "active": False,
    }


def test_example_activates_and_runs_the_images_own_sitecustomize(image):
    found = json.loads(_run(image, image["example_dir"], image["image_dir"], env={"NRL_SHIM": "1"}).stdout)
    assert found == {
        "sitecustomize": str(image["example_dir"] / "sitecustomize.py"),
        "image_hook_ran": "yes",
        "active": True,
    }


def test_example_without_nrl_shim_env_only_chains(image):
    found = json.loads(_run(image, image["example_dir"], image["image_dir"]).stdout)
    assert found == {
        "sitecustomize": str(image["example_dir"] / "sitecustomize.py"),
        "image_hook_ran": "yes",
        "active": False,
    }


def test_doctor_says_a_child_comes_up_active(image):
    # What the README tells a user to check in the image.
    proc = _run(image, image["example_dir"], image["image_dir"], args=("-m", "nrl_shim.cli", "doctor"))
    assert "env activation: .pth NOT installed; a child interpreter with NRL_SHIM=1 came up active" in proc.stdout
