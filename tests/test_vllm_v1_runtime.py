"""vllm-v1-runtime: NRL_VLLM_USE_V1 -> VLLM_USE_V1 on releases that read it (<= 0.11.0), V0 requests that cannot
work fail with a clear UnsupportedConfigError. Expectations are per installed release:

  release          VLLM_USE_V1 set by the shim      NRL_VLLM_USE_V1=0 sync          NRL_VLLM_USE_V1=0 async
  0.8.5, 0.10.x    when NRL_VLLM_USE_V1 is set      V0 engine config                error (async is V1-only)
  0.11.0           when it is 1, never 0            error (V0 removed in 0.11.0)    error (async is V1-only)
  >= 0.11.1        no (variable gone)               error (V0 removed in 0.11.0)    error (async is V1-only)

NRL_VLLM_USE_V1 unset: VLLM_USE_V1 is never touched; vLLM's own default (V1) and its own fallback to V0 stand.
On 0.8.x this CPU machine's platform has no V1 (vLLM: "VLLM_USE_V1=1 is not supported with device type=cpu"), so there
the V1 side is checked through that very error (it proves vLLM saw the VLLM_USE_V1=1 the shim set), and the unset case
through vLLM's fallback to V0, which the shim must leave working.
"""

import pytest

from nrl_shim.quirks.vllm.config import v1_runtime as quirk

from vllm_helpers import VLLM_VERSION, build, cpu_has_v1, has_v0_engine, has_v1_variable, model_dirs, requires_vllm

pytestmark = requires_vllm
ASYNC_MESSAGE = (
    "the async engine (vllm.v1.engine.async_llm.AsyncLLM) always runs V1. Switch to synchronous inference "
    "(policy.generation.vllm_cfg.async_engine=False) or drop NRL_VLLM_USE_V1=0."
)


def _cases(model):
    return [{"path": path, "model": model} for path in ("engine_args", "llm_kw", "async_llm", "async_llm_engine")]


def _by_path(phase):
    return {r["path"]: r for r in phase["results"]}


def test_nrl_vllm_use_v1_wins_and_disabling_restores_vllms_choice(tmp_path):
    llama = model_dirs(tmp_path, ("llama",))["llama"]
    spec = {
        "phases": [
            {"cases": _cases(llama)},
            # Disabled: the shim neither sets VLLM_USE_V1 nor refuses V0.
            {
                "env": {"NRL_SHIM": "1", "NRL_SHIM_DISABLE": quirk.ID, "NRL_VLLM_USE_V1": "0"},
                "unset": ["VLLM_USE_V1"],
                "cases": _cases(llama),
            },
        ]
    }
    # The user's VLLM_USE_V1=0 loses to an explicit NRL_VLLM_USE_V1=1, as in NeMo RL.
    out, proc = build(spec, env={"NRL_SHIM": "1", "NRL_VLLM_USE_V1": "1", "VLLM_USE_V1": "0"})
    on, disabled = out["phases"]
    if has_v1_variable():
        assert out["import_env"] == "1"  # set as vllm.envs was imported, before any vLLM module read it
        assert (
            "[vllm-v1-runtime] environment VLLM_USE_V1: '0' -> '1' (NRL_VLLM_USE_V1=1 wins over the "
            "VLLM_USE_V1=0 you set, as in NeMo RL)"
        ) in proc.stderr
        if has_v0_engine():  # 0.8-0.10 choose their engine classes at import time from this variable
            assert out["engine_classes"] == {
                "LLMEngine": "vllm.v1.engine.llm_engine",
                "AsyncLLMEngine": "vllm.v1.engine.async_llm",
            }
    else:
        assert out["import_env"] == "0"  # no such variable on this release: left as the user set it
        assert "[vllm-v1-runtime]" not in proc.stderr
    for _path, r in _by_path(on).items():
        if cpu_has_v1():
            assert "error" not in r, r
        else:  # 0.8.x: vLLM refuses V1 on the CPU platform - because it saw VLLM_USE_V1=1; the shim says who insisted
            assert r["error"] == "UnsupportedConfigError", r
            assert r["message"].startswith("NRL_VLLM_USE_V1=1 is set, so the shim set VLLM_USE_V1=1"), r
            assert "(vLLM: VLLM_USE_V1=1 is not supported with" in r["message"], r
    # Disabled with NRL_VLLM_USE_V1=0: nothing from the shim; vLLM picks its engine itself.
    for _path, r in _by_path(disabled).items():
        assert not r.get("shim_error"), r
    assert [quirk.ID, "vllm.engine.arg_utils"] not in disabled["patched"]
    if not has_v1_variable():
        assert disabled["env_after"] is None


def test_unset_leaves_vllms_own_choice_and_fallback(tmp_path):
    """NRL_VLLM_USE_V1 unset: VLLM_USE_V1 untouched, whatever the release; where vLLM falls back to V0 by itself
    (0.8.x on this CPU platform) the configuration still builds, with one warning from the shim."""
    llama = model_dirs(tmp_path, ("llama",))["llama"]
    out, proc = build({"phases": [{"cases": _cases(llama)}]}, env={"NRL_SHIM": "1"})
    assert out["import_env"] is None
    assert "[vllm-v1-runtime] environment VLLM_USE_V1" not in proc.stderr
    for _path, r in _by_path(out["phases"][0]).items():
        assert "error" not in r, r
    fell_back = has_v0_engine() and not cpu_has_v1()
    assert ("runs this engine on V0" in proc.stderr) == fell_back, proc.stderr[-3000:]
    if fell_back:
        assert proc.stderr.count("[vllm-v1-runtime]") == 1  # one warning, however many engines


def test_v0_request_per_release(tmp_path):
    llama = model_dirs(tmp_path, ("llama",))["llama"]
    cases = _cases(llama) + [{"path": "openai_server", "model": llama}]
    out, proc = build(cases, env={"NRL_SHIM": "1", "NRL_VLLM_USE_V1": "0"})
    results = _by_path(out["phases"][0])
    # The async engine refuses V0 on every release, before vLLM's own "This should not happen" error.
    assert results["async_llm"]["shim_error"] and results["async_llm"]["error"] == "UnsupportedConfigError"
    assert results["async_llm"]["message"].endswith(ASYNC_MESSAGE)
    assert results["async_llm"]["records"] == []  # raised before any engine config was built
    if has_v0_engine():
        assert out["import_env"] == "0"
        assert out["engine_classes"] == {
            "LLMEngine": "vllm.engine.llm_engine",
            "AsyncLLMEngine": "vllm.engine.async_llm_engine",
        }
        # Sync engine, the real V0 AsyncLLMEngine and the OpenAI server build V0 configs.
        for path in ("engine_args", "llm_kw", "async_llm_engine", "openai_server"):
            assert "error" not in results[path], results[path]
        assert out["phases"][0]["envs_use_v1"] is False
    else:
        assert out["import_env"] is None  # never VLLM_USE_V1=0: that only leads to vLLM's unclear error
        expected = (
            f"NRL_VLLM_USE_V1=0 asks for vLLM's V0 engine, but the installed vLLM {VLLM_VERSION} has none "
            f"(V0 was removed in vLLM 0.11.0). Unset NRL_VLLM_USE_V1 (or set it to 1), or install vLLM < 0.11.0."
        )
        for path in ("engine_args", "llm_kw", "openai_server"):
            assert results[path]["error"] == "UnsupportedConfigError" and results[path]["message"] == expected
        # AsyncLLMEngine is an alias of AsyncLLM here: the async message
        assert results["async_llm_engine"]["message"].endswith(ASYNC_MESSAGE)


@pytest.mark.parametrize(
    "version, wanted, fragment",
    [
        ("0.8.5", True, "sets VLLM_USE_V1=1"),
        ("0.10.1.1", False, "the async engine (AsyncLLM) will refuse V0"),
        ("0.11.0", True, "V1 only (VLLM_USE_V1=0 is an error)"),
        ("0.11.2", False, "will fail at engine creation"),
        ("0.33.0", True, "V1 only, no VLLM_USE_V1 variable"),
        ("0.9.1", None, "its default (V1, falling back to V0 by itself), not changed"),
        ("0.33.0", None, "NRL_VLLM_USE_V1 unset; vLLM 0.33.0: V1 only"),
    ],
)
def test_doctor_line(version, wanted, fragment):
    from nrl_shim.registry import load_settings

    environ = {} if wanted is None else {"NRL_VLLM_USE_V1": "1" if wanted else "0"}
    line = quirk.describe(load_settings(environ), version)
    assert fragment in line and version in line
