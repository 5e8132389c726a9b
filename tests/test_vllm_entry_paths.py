"""Every vLLM engine entry path reaches the shim through EngineArgs.create_engine_config() - checked on the REAL
vLLM of this venv (0.8.5 ... 0.33.0): LLM(model=...), LLM("path"), EngineArgs / AsyncEngineArgs
.create_engine_config(), AsyncLLM.from_engine_args, AsyncLLMEngine.from_engine_args (real V0 class up to 0.10.x, an
alias of AsyncLLM later) and the OpenAI server (AsyncEngineArgs.from_cli_args + build_async_engine_client...).

Each path runs in a fresh interpreter up to the config vLLM built (see children/vllm_configs.py), for tiny gemma2, gemma3_text,
gemma3 (multimodal) and llama configs, with the shim active and with the shim off.
"""

from vllm_helpers import (
    ALL_KINDS,
    ASYNC_PATHS,
    ENTRY_PATHS,
    GEMMA3_KIND,
    GEMMA_KINDS,
    VLLM_VERSION,
    build,
    cpu_env,
    has_v1_variable,
    model_dirs,
    requires_vllm,
)

pytestmark = requires_vllm
RECIPE = "grpo-deepscaler-1.5b-8K"


def _cases(dirs, kinds):
    return [
        {"path": path, "model": dirs[kind], "kind": kind, "kwargs": {"load_format": "dummy"}}
        for path in ENTRY_PATHS
        for kind in kinds
    ]


def _check_complete(results, kinds):
    failed = [r for r in results if "error" in r]
    assert not failed, f"entry paths that did not reach create_engine_config on vLLM {VLLM_VERSION}: {failed}"
    assert {(r["path"], r["case"]["kind"]) for r in results} == {(p, k) for p in ENTRY_PATHS for k in kinds}
    for r in results:
        assert r["model_type"] == r["case"]["kind"]
        assert r["args_type"] == ("AsyncEngineArgs" if r["path"] in ASYNC_PATHS else "EngineArgs"), r


def test_every_entry_path_with_and_without_the_shim(tmp_path):
    dirs = model_dirs(tmp_path)
    env = dict(cpu_env(), NRL_SHIM="1", NRL_SHIM_RECIPE=RECIPE)
    off_kinds = (GEMMA3_KIND, "llama")
    spec = {
        "phases": [
            {"cases": _cases(dirs, ALL_KINDS)},  # activated at interpreter start-up, before vLLM was imported
            # deactivate(): every entry path is back to vLLM's own behaviour (NRL_SHIM=0 from the start is covered by
            # test_explain, which builds the same config in a fresh interpreter that never activated).
            {"env": {"NRL_SHIM": "0", "NRL_SHIM_RECIPE": RECIPE}, "cases": _cases(dirs, off_kinds)},
            {"env": env, "cases": _cases(dirs, off_kinds)},  # and activated again, after vLLM was imported
        ]
    }
    out, proc = build(spec, env=env)
    on, off, again = out["phases"]

    _check_complete(on["results"], ALL_KINDS)
    for r in on["results"]:
        gemma = r["case"]["kind"] in GEMMA_KINDS
        assert r["load_format"] == ("auto" if gemma else "dummy"), r
        assert r["args_enforce_eager"] is True and r["enforce_eager"] is True, r
        if cpu_env() == {}:  # the V1 quirk is on in this child
            assert r["VLLM_USE_V1"] == ("1" if has_v1_variable() else None), r
    # One INFO line per change (the log de-duplicates repeats), naming the quirk and before -> after.
    for kind in GEMMA_KINDS:
        assert (
            f"[vllm-gemma-load-format] vllm load_format for {kind} model '{dirs[kind]}': 'dummy' -> 'auto'"
            in proc.stderr
        )
    assert "vllm load_format for llama" not in proc.stderr
    eager_lines = [
        line
        for line in proc.stderr.splitlines()
        if f"[vllm-eager-recipes] vllm enforce_eager for recipe {RECIPE}:" in line
    ]
    # 0.8.x: EngineArgs defaults enforce_eager to None, its CLI parser to False: two distinct changes, each logged once
    assert eager_lines and len(eager_lines) == len(set(eager_lines)) <= 2, eager_lines

    assert off["active"] is False
    _check_complete(off["results"], off_kinds)
    for r in off["results"]:
        assert r["load_format"] == "dummy" and not r["args_enforce_eager"], r

    _check_complete(again["results"], off_kinds)
    for r in again["results"]:
        assert r["load_format"] == ("auto" if r["case"]["kind"] == GEMMA3_KIND else "dummy"), r
        assert r["args_enforce_eager"] is True, r
