"""vllm-auto-load-format: the model types NeMo RL (HEAD) loads with real weights besides Gemma — the Nemotron-H Nano VL
types of its is_nano_nemotron_vl_model — and the user's own (NRL_SHIM_AUTO_LOAD_MODEL_TYPES): load_format "dummy" ->
"auto". The fix function on EngineArgs-shaped objects in-process (no vLLM needed), then on the REAL
EngineArgs.create_engine_config() of this venv's vLLM in a fresh interpreter.
"""

import json
import logging
import types

import pytest

from nrl_shim.quirks import _hf_config as hf_config
from nrl_shim.quirks.vllm.config import auto_load_format as quirk
from nrl_shim.registry import load_settings

from vllm_helpers import build, cpu_env, model_dirs, requires_vllm


@pytest.fixture(autouse=True)
def _fresh_hf_cache():
    hf_config.clear_cache()
    yield
    hf_config.clear_cache()


def _model(tmp_path, model_type):
    directory = tmp_path / model_type
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["X"]}))
    return str(directory)


def _engine_args(model, load_format="dummy", **extra):
    return types.SimpleNamespace(model=model, load_format=load_format, revision=None, hf_overrides=None, **extra)


@pytest.fixture
def shim_log(caplog):
    logger = logging.getLogger("nrl_shim")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG, logger="nrl_shim")
    yield caplog
    logger.removeHandler(caplog.handler)


@pytest.mark.parametrize("model_type", sorted(quirk.NEMO_RL_MODEL_TYPES))
def test_nemo_rl_types_load_real_weights_with_nemo_rls_reason(tmp_path, model_type, shim_log):
    model = _model(tmp_path, model_type)
    args = _engine_args(model)
    quirk.fix_engine_args(args, load_settings({}))
    assert args.load_format == "auto"
    (line,) = [r.getMessage() for r in shim_log.records if r.getMessage().startswith(f"[{quirk.ID}]")]
    assert line.startswith(f"[{quirk.ID}] vllm load_format for {model_type} model {model!r}: 'dummy' -> 'auto' (")
    assert "NeMo RL loads real weights for this model type (ModelFlag.VLLM_LOAD_FORMAT_AUTO)" in line
    assert "gives no reason" in line and "gemma" not in line.lower()


@pytest.mark.parametrize(
    "model_type, environ, load_format, expected",
    [
        ("llama", {}, "dummy", "dummy"),  # not listed anywhere
        ("gemma3_text", {}, "dummy", "dummy"),  # Gemma is the other quirk's (its own reason and fixed release)
        ("llama", {"NRL_SHIM_AUTO_LOAD_MODEL_TYPES": "qwen2,llama"}, "dummy", "auto"),
        ("llama", {"NRL_SHIM_AUTO_LOAD_MODEL_TYPES": "llama"}, "safetensors", "safetensors"),  # only dummy changes
        ("nemotronh_nano_vl_v2", {}, "dummy", "dummy"),  # NeMo RL matches model_type exactly
        ("NemotronH_Nano_VL_V2", {}, "DUMMY", "auto"),  # vLLM accepts the load format in any case
    ],
)
def test_which_configs_change(tmp_path, model_type, environ, load_format, expected, shim_log):
    args = _engine_args(_model(tmp_path, model_type), load_format)
    quirk.fix_engine_args(args, load_settings(environ))
    assert args.load_format == expected
    lines = [r.getMessage() for r in shim_log.records if quirk.ID in r.getMessage()]
    assert len(lines) == (1 if expected != load_format else 0)
    if environ and expected == "auto":
        assert lines[0].endswith("(listed in NRL_SHIM_AUTO_LOAD_MODEL_TYPES)")


def test_unreadable_model_or_no_settings_leave_the_config_alone(tmp_path):
    for model in (str(tmp_path / "missing"), 42, None):
        args = _engine_args(model)
        quirk.fix_engine_args(args, load_settings({"NRL_SHIM_AUTO_LOAD_MODEL_TYPES": "llama"}))
        assert args.load_format == "dummy"
    args = _engine_args(_model(tmp_path, "NemotronH_Nano_VL_V2"))
    quirk.fix_engine_args(args, None)
    assert args.load_format == "dummy"


def test_setting_is_validated_with_one_line():
    from nrl_shim.errors import SettingsError

    with pytest.raises(SettingsError, match="NRL_SHIM_AUTO_LOAD_MODEL_TYPES='a b' is not valid; accepted: one"):
        load_settings({"NRL_SHIM_AUTO_LOAD_MODEL_TYPES": "a b"})


def test_doctor_line_lists_the_types():
    line = quirk.describe(load_settings({"NRL_SHIM_AUTO_LOAD_MODEL_TYPES": "my_model"}), "0.33.0")
    assert "NemotronH_Nano_VL_V2" in line and "NemotronH_Nano_Omni_Reasoning_V3" in line
    assert "(yours: my_model)" in line


@requires_vllm
def test_real_engine_config_with_a_users_model_type(tmp_path):
    """A user's own type (here llama, which vLLM builds on every release) on the real EngineArgs: auto with the
    setting, dummy without it or with the quirk disabled."""
    llama = model_dirs(tmp_path, ("llama",))["llama"]
    case = [{"path": "engine_args", "label": "llama", "model": llama, "kwargs": {"load_format": "dummy"}}]
    base = dict(cpu_env(), NRL_SHIM="1")
    disable = ",".join(filter(None, [cpu_env().get("NRL_SHIM_DISABLE"), quirk.ID]))
    spec = {
        "phases": [
            {"cases": case},
            {"env": dict(base, NRL_SHIM_AUTO_LOAD_MODEL_TYPES=""), "cases": case},
            {"env": dict(base, NRL_SHIM_DISABLE=disable), "cases": case},
        ]
    }
    out, proc = build(spec, env=dict(base, NRL_SHIM_AUTO_LOAD_MODEL_TYPES="llama"))
    results = [phase["results"][0] for phase in out["phases"]]
    assert all("error" not in r for r in results), results
    assert [r["load_format"] for r in results] == ["auto", "dummy", "dummy"]
    assert (
        f"[{quirk.ID}] vllm load_format for llama model '{llama}': 'dummy' -> 'auto' "
        "(listed in NRL_SHIM_AUTO_LOAD_MODEL_TYPES)" in proc.stderr
    )
