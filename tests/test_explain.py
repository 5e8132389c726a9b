"""`nrl-shim explain`: the real vLLM engine config with and without the shim, each difference with its quirk.

One end-to-end run of the newcomer's command (`--demo`, JSON output) on this venv's vLLM; the report text and the
attribution rules are then checked in-process on that run's data and on small synthetic inputs.
"""

import json

import pytest

from nrl_shim import explain

from conftest import run_child
from vllm_helpers import requires_vllm

_demo_cache = {}


def _demo():
    if "out" not in _demo_cache:
        proc = run_child("cli_main", "explain", "--demo", "--json", timeout=900)
        _demo_cache["out"] = json.loads(proc.stdout.strip().splitlines()[-1])
    return _demo_cache["out"]


@requires_vllm
def test_demo_shows_every_fix_with_its_quirk():
    out = _demo()
    rows = {row["field"]: row for row in out["differences"]}
    assert rows["load_config.load_format"]["before"] == "dummy" and rows["load_config.load_format"]["after"] == "auto"
    assert rows["load_config.load_format"]["quirk"] == "vllm-gemma-load-format"
    eager_rows = [row for row in out["differences"] if row["quirk"] == "vllm-eager-recipes"]
    assert eager_rows, out["differences"]  # enforce_eager itself, or (0.8.x on CPU, always eager) the graph sizes
    if "model_config.enforce_eager" in rows:
        assert (rows["model_config.enforce_eager"]["before"], rows["model_config.enforce_eager"]["after"]) == (
            False,
            True,
        )
    assert all(row["quirk"] != "?" for row in out["differences"]), out["differences"]
    # NRL_VLLM_USE_V1 unset: the shim leaves VLLM_USE_V1 to vLLM on both sides (and vLLM's own V0 fallback works).
    assert rows.get("environment VLLM_USE_V1 (as vLLM was imported)") is None
    assert out["notes"] == []
    quirks_logged = {change["quirk"] for change in out["with"]["changes"]}
    assert {"vllm-gemma-load-format", "vllm-eager-recipes"} <= quirks_logged
    assert out["without"]["shim_active"] is False and out["with"]["shim_active"] is True
    assert out["without"]["changes"] == []


@requires_vllm
def test_demo_report_text(capsys):
    out = _demo()
    rows = [tuple(row.values()) for row in out["differences"]]
    explain._print_report(out["request"], out["without"], out["with"], rows, out["notes"])
    text = capsys.readouterr().out
    assert "What the shim changed (its log lines):" in text
    assert "[vllm-gemma-load-format] vllm load_format for gemma3_text model" in text
    assert "load_config.load_format" in text and "'dummy' -> 'auto'   [vllm-gemma-load-format]" in text
    assert f"{len(rows)} difference(s)" in text


def test_attribution_rules():
    off = {
        "config": {
            "load_config.load_format": "dummy",
            "model_config.enforce_eager": False,
            "compilation_config.level": 2,
            "instance_id": "a",
            "x.other": 1,
        },
        "env": {"VLLM_USE_V1": {"at_import": None}},
    }
    on = {
        "config": {
            "load_config.load_format": "auto",
            "model_config.enforce_eager": True,
            "compilation_config.level": 0,
            "instance_id": "b",
            "x.other": 2,
        },
        "env": {"VLLM_USE_V1": {"at_import": "1"}},
        "changes": [{"quirk": "vllm-gemma-load-format"}, {"quirk": "vllm-eager-recipes"}],
    }
    rows = {row[0]: row[3:] for row in explain.compare(off, on)}
    assert rows == {
        "environment VLLM_USE_V1 (as vLLM was imported)": ("vllm-v1-runtime", ""),
        "load_config.load_format": ("vllm-gemma-load-format", ""),
        "model_config.enforce_eager": ("vllm-eager-recipes", ""),
        "compilation_config.level": ("vllm-eager-recipes", "follows from enforce_eager"),
        "x.other": ("?", "follows from the changes above"),  # two quirks changed args: not guessed
    }
    on["changes"] = [{"quirk": "vllm-gemma-load-format"}]
    assert dict((r[0], r[3]) for r in explain.compare(off, on))["x.other"] == "vllm-gemma-load-format"
    assert explain.compare(off, off) == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "demo:nope"], "--model 'demo:nope' is not valid; accepted demo models: demo:gemma2"),
        (["--demo", "--arg", "no_equals"], "--arg 'no_equals' is not valid; accepted: KEY=VALUE"),
        ([], "one of the arguments --demo --model is required"),
    ],
)
def test_bad_arguments_name_what_is_accepted(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        explain.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
