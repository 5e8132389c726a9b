"""The quirk index (nrl_shim/_quirk_index.py): what activation reads instead of importing every quirk module. It must
be exactly what the quirk modules declare, and activation must import no quirk module until one of its targets is."""

import importlib
import os

import pytest

from nrl_shim import _quirk_index, docs, registry

from conftest import SOURCE_ROOT, run_child_json

# What activation (`import nrl_shim`, or a start-up that could not be armed: tests/test_startup.py) imports, whatever
# the number of quirks, once the plugin index is written.
START_UP = [
    "nrl_shim",
    "nrl_shim._quirk_index",
    "nrl_shim._startup",
    "nrl_shim.activation",
    "nrl_shim.plugins",
    "nrl_shim.registry",
    "nrl_shim.settings",
]
# vllm-dist-alias's setup() runs in every process: its finder must be there before anything asks for vLLM's metadata.
# Its library's packages come with it (their __init__s are stdlib only).
START_UP += [
    "nrl_shim.quirks",
    "nrl_shim.quirks.vllm",
    "nrl_shim.quirks.vllm.config",
    "nrl_shim.quirks.vllm.config.dist_alias",
]


def test_index_file_is_generated_from_the_quirk_modules():
    assert docs.INDEX_PATH.read_text() == docs.quirk_index_source(), (
        "nrl_shim/_quirk_index.py is stale: regenerate it with `python -m nrl_shim.docs`"
    )


def test_the_start_up_plan_watches_what_activation_watches():
    # The plan an armed start-up reads (written with the plugin index; here over no sys.path entry: the built-ins
    # alone) against the quirk index: every target, every variable, the deferred setup and the setup's option.
    from nrl_shim import plugins
    from nrl_shim.settings import SHARED_VARIABLES

    _found, plan, files = plugins._index(())
    modules, distributions, variables, options = plan
    assert modules == {name for entry in _quirk_index.QUIRKS for name in entry[2]}
    assert {name for name, _ in _quirk_index.PRE_TARGETS} <= modules
    assert distributions == {"vllm"} and options == ("--config",)  # vllm-dist-alias, vllm-eager-recipes
    declared = {v.name for v in SHARED_VARIABLES} | {v.name for entry in _quirk_index.QUIRKS for v in entry[4]}
    assert set(variables) == (declared - {"NRL_SHIM"}) | {"NRL_SHIM_PLUGINS"}
    assert files == (_quirk_index.__file__,)


def test_index_declares_what_each_quirk_module_declares():
    # Independent of how the generator writes the file: the index's view of each quirk against the module's own.
    assert [entry[0] for entry in _quirk_index.QUIRKS] == list(registry.QUIRK_MODULES)
    for entry in _quirk_index.QUIRKS:
        indexed, loaded = registry.Quirk.indexed(*entry), registry.Quirk(importlib.import_module(entry[0]))
        assert indexed.id == loaded.id and indexed.targets == loaded.targets, entry[0]
        assert indexed.setup_argv == loaded.setup_argv, entry[0]
        assert indexed.settings == loaded.settings, entry[0]  # names, parsers, defaults, texts
    deferred = [(q.id, q.module.SETUP_DISTRIBUTION) for q in map(registry.Quirk, map(importlib.import_module,
        registry.QUIRK_MODULES)) if q.setup is not None and getattr(q.module, "SETUP_DISTRIBUTION", None)]  # fmt: skip
    assert list(_quirk_index.SETUP_DISTRIBUTIONS) == deferred


def test_the_rest_of_a_quirk_loads_on_first_use_and_keeps_what_was_set_before():
    entry = next(e for e in _quirk_index.QUIRKS if e[1] == "vllm-async-timeout")
    quirk = registry.Quirk.indexed(*entry)
    assert "module" not in vars(quirk) and quirk.setup is None  # no setup(): known without the module
    quirk.versions = "<1"  # as a test does before activation: the module's declaration must not overwrite it
    module = importlib.import_module(entry[0])
    assert quirk.summary == module.SUMMARY and quirk.module is module
    assert quirk.versions == "<1" and quirk.library == module.LIBRARY


@pytest.mark.parametrize("argv", [[], ["--config", "examples/grpo-deepscaler-1.5b-8K.yaml"]], ids=["plain", "config"])
def test_activation_imports_only_the_quirk_modules_a_process_needs(tmp_path, argv):
    # A stand-in package for Ray (ray-propagate-env's targets), so this runs where Ray is not installed, too.
    package = tmp_path / "site" / "ray"  # beside the cache, not above it: writing the cache changes no watched mtime
    (package / "_private").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_private" / "__init__.py").write_text("")
    (package / "_private" / "worker.py").write_text("def init(*args, **kwargs):\n    return None\n")
    path = os.pathsep.join([SOURCE_ROOT, str(tmp_path / "site")])
    env = {"PYTHONPATH": path, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    run_child_json("activation_lazy_quirk_modules", "ray._private.worker", *argv, env=env)  # writes the plugin index
    out, _ = run_child_json("activation_lazy_quirk_modules", "ray._private.worker", *argv, env=env)
    active, at_activation, after_import = out
    assert active is True
    # vllm-eager-recipes' setup() reads the recipe from `--config`: its module (and the errors module, which it uses
    # to validate the name) loads only where the option is.
    setup = ["nrl_shim.errors", "nrl_shim.quirks.vllm.config.eager_recipes"] if argv else []
    assert at_activation == sorted(START_UP + setup)
    packages = ("nrl_shim.quirks.vllm", "nrl_shim.quirks.vllm.config", "nrl_shim.quirks.ray")
    quirks_loaded = [
        name
        for name in after_import
        if name.startswith("nrl_shim.quirks.") and "._" not in name and name not in packages
    ]
    assert quirks_loaded == sorted(
        ["nrl_shim.quirks.ray.propagate_env", "nrl_shim.quirks.vllm.config.dist_alias", *setup[1:]]
    )


def test_the_index_is_pyprojects_entry_points_in_order():
    # One way to add a quirk: a module plus its line in the entry-point group `nrl_shim.quirks` (nrl-shim's own in
    # pyproject.toml, as any plugin's); the index is generated from that table, entry-point name = the module's ID.
    declared = docs.builtin_declarations()
    assert list(declared.items()) == [(entry[1], entry[0]) for entry in _quirk_index.QUIRKS]
    assert tuple(declared.values()) == registry.QUIRK_MODULES
    assert docs.quirk_index_source(list(declared.values())[:-1]) != docs.INDEX_PATH.read_text()  # a stale one is seen
