"""The quirk index (nrl_shim/quirks/_index.py): what activation reads instead of importing every quirk module. It must
be exactly what the quirk modules declare, and activation must import no quirk module until one of its targets is."""

import importlib
import os

from nrl_shim import docs, registry
from nrl_shim.quirks import _index

from conftest import SOURCE_ROOT, run_child_json


def test_index_file_is_generated_from_the_quirk_modules():
    assert docs.INDEX_PATH.read_text() == docs.quirk_index_source(), (
        "nrl_shim/quirks/_index.py is stale: regenerate it with `python -m nrl_shim.docs`"
    )


def test_index_declares_what_each_quirk_module_declares():
    # Independent of how the generator writes the file: the index's view of each quirk against the module's own.
    assert [entry[0] for entry in _index.QUIRKS] == list(registry.QUIRK_MODULES)
    for entry in _index.QUIRKS:
        indexed, loaded = registry.Quirk.indexed(*entry), registry.Quirk(importlib.import_module(entry[0]))
        assert indexed.id == loaded.id and indexed.targets == loaded.targets, entry[0]
        assert indexed.settings == loaded.settings, entry[0]  # names, parsers, defaults, texts
        has_setup = entry[3]
        assert has_setup == (loaded.setup is not None), entry[0]


def test_the_rest_of_a_quirk_loads_on_first_use_and_keeps_what_was_set_before():
    entry = next(e for e in _index.QUIRKS if e[1] == "vllm-async-timeout")
    quirk = registry.Quirk.indexed(*entry)
    assert "module" not in vars(quirk)
    quirk.versions = "<1"  # as a test does before activation: the module's declaration must not overwrite it
    module = importlib.import_module(entry[0])
    assert quirk.summary == module.SUMMARY and quirk.module is module
    assert quirk.versions == "<1" and quirk.library == module.LIBRARY


def test_activation_imports_only_the_quirk_modules_a_target_needs(tmp_path):
    # A stand-in package for Ray (ray-propagate-env's targets), so this runs where Ray is not installed, too.
    package = tmp_path / "ray"
    (package / "_private").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_private" / "__init__.py").write_text("")
    (package / "_private" / "worker.py").write_text("def init(*args, **kwargs):\n    return None\n")
    path = os.pathsep.join([SOURCE_ROOT, str(tmp_path)])
    out, _ = run_child_json("activation_lazy_quirk_modules", "ray._private.worker", env={"PYTHONPATH": path})
    active, at_activation, after_import = out
    assert active is True
    # The index, and the one quirk with a setup() (it exports the recipe to children at activation).
    assert at_activation == ["nrl_shim.quirks._index", "nrl_shim.quirks.vllm_eager_recipes"]
    quirks_loaded = [name for name in after_import if not name.rpartition(".")[2].startswith("_")]
    assert quirks_loaded == ["nrl_shim.quirks.ray_propagate_env", "nrl_shim.quirks.vllm_eager_recipes"]
