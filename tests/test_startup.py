"""An armed start-up (nrl_shim/_startup.py): with NRL_SHIM=1 and nothing to validate, an interpreter's start-up loads
three small modules and puts two watchers on sys.meta_path; the first import of a quirk's target (or a lookup a setup()
waits for, or a call that needs the full state) completes the activation, with the same result as activating at
start-up. Where arming could differ, start-up activates at once. The children start through nrl_shim/_bootstrap's
sitecustomize (as a Ray worker's own Python does), each with its own plugin-index cache."""

import os

import pytest

from conftest import SOURCE_ROOT, run_child_json

BOOTSTRAP = os.path.join(SOURCE_ROOT, "nrl_shim", "_bootstrap")
ARMED = ["nrl_shim", "nrl_shim._startup", "nrl_shim.plugins"]
# A quirk from outside the catalogue with eight targets, each module's run() wrapped (see test_plugins.py for the
# plugin rules themselves).
PLUGIN = """
ID = "acme-many"
SUMMARY = "wraps run() of eight modules"
LINK = "https://example.org/acme"
LIBRARY = "packaging"
VERSIONS = ">=0"
TARGETS = tuple(f"acme_t{i}" for i in range(8))


def _wrapper(wrapped, instance, args, kwargs):
    return "patched"


def patch(module, settings):
    from nrl_shim.patching import wrap

    wrap(module, "run", _wrapper, ID)


def unpatch(module):
    from nrl_shim.patching import unwrap

    unwrap(module, "run", ID)
"""


@pytest.fixture
def site(tmp_path):
    """A directory on the children's PYTHONPATH: a stand-in for Ray's worker module (ray-propagate-env's target, so
    this runs where Ray is not installed) and eight plain modules."""
    site = tmp_path / "site"
    (site / "ray" / "_private").mkdir(parents=True)
    (site / "ray" / "__init__.py").write_text("")
    (site / "ray" / "_private" / "__init__.py").write_text("")
    (site / "ray" / "_private" / "worker.py").write_text("def init(*args, **kwargs):\n    return None\n")
    for i in range(8):
        (site / f"acme_t{i}.py").write_text("def run():\n    return 'original'\n")
    return site


def start(tmp_path, site, *args, env=None):
    path = os.pathsep.join([BOOTSTRAP, SOURCE_ROOT, str(site)])
    extra = {"NRL_SHIM": "1", "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": path, **(env or {})}
    out, _ = run_child_json("startup_probe", *args, env=extra, cwd=tmp_path)
    return out


def install_plugin(site):
    (site / "acme_many.py").write_text(PLUGIN)
    info = site / "acme_many-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-many\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nrl_shim.quirks]\nacme-many = acme_many\n")


def test_start_up_arms_and_the_first_target_import_activates(tmp_path, site):
    install_plugin(site)
    args = ("--target", "acme_t0", "--target", "ray._private.worker")
    first = start(tmp_path, site, *args)  # no plugin index yet: this start scans and activates at once
    assert "nrl_shim.activation" in first["at_start"] and first["finders_at_start"][0] == "_TargetFinder"
    out = start(tmp_path, site, *args)
    assert out["at_start"] == ARMED and out["finders_at_start"] == ["Watcher", "Watcher"]
    assert out["active"] is True
    # The first import completed the activation: the same patches, finders and quirk modules as activating at once.
    assert out["results"] == first["results"] == {"acme_t0": "patched", "ray._private.worker": None}
    assert out["patched"] == first["patched"] and ["acme-many", "acme_t0"] in out["patched"]  # (+ Ray's, if installed)
    assert out["finders"] == ["_TargetFinder", "Watcher", "VllmAliasFinder"]  # the import watcher replaced in place
    assert first["finders"] == ["_TargetFinder", "VllmAliasFinder"]
    quirk_modules = [name for name in out["after"] if name.startswith("nrl_shim.quirks.")]
    assert quirk_modules == [name for name in first["after"] if name.startswith("nrl_shim.quirks.")]
    assert "nrl_shim.quirks.ray.propagate_env" in quirk_modules  # the built-in's module, at its target's import


def test_a_plugin_is_not_imported_at_start_up_and_threads_racing_its_targets_all_get_the_fix(tmp_path, site):
    install_plugin(site)
    targets = [arg for i in range(8) for arg in ("--target", f"acme_t{i}")]
    start(tmp_path, site)  # installed since the last start: this one scans (and imports the plugin once)
    out = start(tmp_path, site, *targets)
    assert out["at_start"] == ARMED  # the plugin's record came from the index: its module was not imported
    assert out["results"] == {f"acme_t{i}": "patched" for i in range(8)}
    assert sorted(out["patched"]) == sorted(["acme-many", f"acme_t{i}"] for i in range(8))
    off = start(tmp_path, site, *targets, env={"NRL_SHIM": "0"})
    assert off["results"] == {f"acme_t{i}": "original" for i in range(8)}  # what the fix changes


@pytest.mark.parametrize(
    "env, args",
    [
        ({"NRL_SHIM_DISABLE": "ray-propagate-env"}, ()),  # a setting: validated at start-up
        ({"NRL_SHIM_LOG_LEVEL": "WARNING"}, ()),
        ({"NRL_SHIM_PLUGINS": "acme_t0"}, ()),
        ({}, ("--config", "examples/grpo-deepscaler-1.5b-8K.yaml")),  # vllm-eager-recipes' setup() has work here
    ],
    ids=["disable", "log-level", "plugins-variable", "setup-argv"],
)
def test_start_up_activates_at_once_where_arming_could_differ(tmp_path, site, env, args):
    start(tmp_path, site)  # the plugin index is written
    out = start(tmp_path, site, *args, env=env)
    assert "nrl_shim.activation" in out["at_start"] and out["finders_at_start"][0] == "_TargetFinder"


def test_an_armed_start_up_deactivates(tmp_path, site):
    start(tmp_path, site)
    out = start(tmp_path, site, "--deactivate", "--target", "ray._private.worker")
    assert out["at_start"] == ARMED and out["active"] is True
    assert out["active_after_deactivate"] is False and out["finders"] == [] and out["patched"] == []
