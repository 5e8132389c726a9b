"""nrl_shim/_bootstrap/sitecustomize.py: activation where a .pth can't be used (a Ray worker's own venv and its
children, a pruned image), chaining to an existing sitecustomize."""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import SOURCE_ROOT, child_env

EXAMPLE = Path(SOURCE_ROOT) / "nrl_shim" / "_bootstrap"


def test_sitecustomize_activates_and_chains(tmp_path):
    existing = tmp_path / "image_site"
    existing.mkdir()
    (existing / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITECUSTOMIZE_RAN'] = 'yes'\n")
    env = child_env({"NRL_SHIM": "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLE), str(existing), env["PYTHONPATH"]])
    code = (
        "import json, os, sys; m = sys.modules.get('nrl_shim'); "
        "print(json.dumps([sys.modules['sitecustomize'].__file__, os.environ.get('IMAGE_SITECUSTOMIZE_RAN'), "
        "bool(m and m.is_active())]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [str(EXAMPLE / "sitecustomize.py"), "yes", True]


def test_sitecustomize_bad_setting_exits_with_one_line(tmp_path):
    env = child_env({"NRL_SHIM": "1", "NRL_SHIM_STRICT": "sometimes"})
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLE), env["PYTHONPATH"]])
    proc = subprocess.run(
        [sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "nrl-shim: error: NRL_SHIM_STRICT='sometimes' is not valid; accepted: 1 or 0 (also true/false, yes/no, on/off)"
    ]
