"""vllm-lora-refit on real engines (vLLM's CPU build): a tiny Llama with prefix caching and a rank-8 PEFT adapter on
q/k/v/o; a 300-token prompt served with adapter A, the adapter becomes B by each route an RL loop uses, the prompt
served again (tests/children/lora_refit_engine.py). The second rollout must be B's: the reference is B under a fresh
name after the engine's own reset_prefix_cache() (and A's the same way).

Two engines per run (one child each, every route in sequence on one engine): `LLM` with the engine core in the
child's own process, and `AsyncLLM` (engine core in its own process) with a request using A running across each
change. "Without the fix" is the shim with this fix disabled; there each broken route must reproduce its failure
(vLLM 0.32: stale prefix blocks of A, or A itself still serving), so these tests fail if the bug stops reproducing.
"""

import pytest

from conftest import child_path, run_case
from vllm_helpers import REAL_ENGINE

ID = "vllm-lora-refit"
PROMPT = [(i * 37) % 500 + 3 for i in range(300)]  # 18 full KV blocks of 16: a long shared prefix
LONG_PROMPT = [(i * 53) % 500 + 3 for i in range(300)]  # the request running across each change (AsyncLLM)
MAX_TOKENS = 8
LONG_TOKENS = 64  # still running when the change lands (it starts after its 4th token), short enough for CI
ROUTES = ("fresh", "inplace", "newpath", "remove", "remove_newpath", "newid")
# What each broken route serves without the fix (vLLM 0.32): A's prefix blocks for a prompt it serves with B, or A.
STALE_PREFIX = ("inplace", "remove", "newid")
# AsyncLLM: remove_lora while a request with A runs has the workers load A again at the next step (from that request's
# path), and the same id at B's path then finds it loaded.
OLD_ADAPTER = {"llm": ("newpath",), "async_llm": ("newpath", "remove_newpath")}
RIGHT_WITHOUT_FIX = {"llm": ("fresh", "remove_newpath"), "async_llm": ("fresh",)}
WITHOUT_FIX = {"NRL_SHIM": "1", "NRL_SHIM_DISABLE": ID}
WITH_FIX = {"NRL_SHIM": "1"}
pytestmark = REAL_ENGINE


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    from tiny_models import write_lora_adapter, write_model

    root = tmp_path_factory.mktemp("lora-models")
    model = write_model(root / "model", "llama", seed=0, overrides={"max_position_embeddings": 1024})
    return {
        "model": model,
        "a": write_lora_adapter(root / "adapter-a", model, seed=1),
        "b": write_lora_adapter(root / "adapter-b", model, seed=2),
    }


def run(tmp_path_factory, adapters, mode, env, name):
    tmp = tmp_path_factory.mktemp(f"{mode}-{name}")
    case = {
        "mode": mode,
        **adapters,
        "work": str(tmp / "work"),
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "long_prompt": LONG_PROMPT,
        "long_tokens": LONG_TOKENS,
        "routes": list(ROUTES),
    }
    out, proc = run_case(child_path("lora_refit_engine"), case, tmp, env=env, timeout=900, name=name)
    return {**out, "stderr": proc.stderr}


@pytest.fixture(scope="module")
def llm(tmp_path_factory, adapters):
    """`LLM`, engine core in the child's process (TRL's colocate engine): every route, without and with the fix."""
    return {
        "without": run(tmp_path_factory, adapters, "llm", WITHOUT_FIX, "without"),
        "with": run(tmp_path_factory, adapters, "llm", WITH_FIX, "with"),
    }


@pytest.fixture(scope="module")
def async_llm(tmp_path_factory, adapters):
    """`AsyncLLM`, engine core in its own process, a request with A streaming across each change."""
    return {
        "without": run(tmp_path_factory, adapters, "async", WITHOUT_FIX, "without"),
        "with": run(tmp_path_factory, adapters, "async", WITH_FIX, "with"),
    }


def gap(rollout, expected):
    return max(abs(a - b) for a, b in zip(rollout["logprobs"], expected["logprobs"]))


def assert_b(rollout, reference):
    assert rollout["tokens"] == reference["b"]["tokens"], (rollout, reference["b"])
    assert gap(rollout, reference["b"]) < 1e-3, (rollout, reference["b"])


def assert_sound(run):
    """The engine is sound: A and B differ, and every route's first rollout is A's."""
    reference = run["reference"]
    assert reference["a"]["tokens"] != reference["b"]["tokens"]
    for route in ROUTES:
        assert run["routes"][route]["result"]["first"]["tokens"] == reference["a"]["tokens"], route


def ours(log):
    return [message for _level, message in log if f"[{ID}]" in message]


@pytest.mark.parametrize("engine", ["llm", pytest.param("async_llm", marks=pytest.mark.full)])
def test_without_the_fix_each_broken_route_serves_the_old_adapter(engine, request):
    run = request.getfixturevalue(engine)["without"]
    assert_sound(run)
    reference = run["reference"]
    for route in STALE_PREFIX:  # A's blocks for the shared prefix, B's adapter after it: neither policy
        second = run["routes"][route]["result"]["second"]
        assert second["cached"] >= 256, (route, second)
        assert second["tokens"] != reference["b"]["tokens"], f"{route}: the stale prefix did not reproduce"
    for route in OLD_ADAPTER[engine]:  # A keeps serving, exactly
        assert run["routes"][route]["result"]["second"]["tokens"] == reference["a"]["tokens"], route
    for route in RIGHT_WITHOUT_FIX[engine]:  # right without the fix on 0.32 (its key holds the path)
        assert_b(run["routes"][route]["result"]["second"], reference)
    assert f"[{ID}]" not in run["stderr"]


@pytest.mark.parametrize("engine", ["llm", pytest.param("async_llm", marks=pytest.mark.full)])
def test_with_the_fix_every_route_serves_the_new_adapter(engine, request):
    run = request.getfixturevalue(engine)["with"]
    assert_sound(run)
    for route in ROUTES:
        second = run["routes"][route]["result"]["second"]
        assert_b(second, run["reference"])
        if route != "fresh":
            assert second["cached"] == 0, (route, second)  # no block of A's version reused


@pytest.mark.full  # AsyncLLM, engine core in its own process: `nox -s vllm_cpu_full` (CI's time)
def test_async_requests_running_across_the_change_finish(async_llm):
    """Every route but "newid": two ids under one name in one batch crash vLLM's worker (its set of active adapters
    dedups by name), with or without the fix."""
    for name in ("without", "with"):
        for route in ROUTES:
            if route == "newid":
                continue
            long = async_llm[name]["routes"][route]["result"]["long"]
            assert long["long_running"] and long["generated"] == LONG_TOKENS, (name, route, long)


def test_in_process_each_change_logged_once_with_its_route(llm):
    routes = llm["with"]["routes"]
    assert ours(routes["fresh"]["log"]) == [
        f"[{ID}] vLLM LoRA adapter: nothing to change (each adapter arrives under a new name and id, so vLLM loads it "
        "and keys its prefix blocks apart; no name or id has changed its weights so far)"
    ]
    expected = {
        "inplace": "files at",
        "newpath": "now at",
        "remove": "removed and added again",
        "newid": "under a new id",
    }
    for route, words in expected.items():
        lines = ours(routes[route]["log"])
        assert len(lines) == 1 and words in lines[0] and " -> " in lines[0], (route, lines)
        assert "vllm-project/vllm#48352" in lines[0]
    assert "workers' copy" in ours(routes["newpath"]["log"])[0]  # the old adapter would keep serving: reloaded
    assert ours(routes["remove_newpath"]["log"]) == []  # the same kind as "remove": logged once, then DEBUG


@pytest.mark.full  # AsyncLLM, engine core in its own process: `nox -s vllm_cpu_full` (CI's time)
def test_engine_core_process_says_it_once_per_kind(async_llm):
    stderr = async_llm["with"]["stderr"]
    assert stderr.count(f"[{ID}] vLLM LoRA adapter: nothing to change") == 1
    for words in ("reloaded in place", "now at", "removed and added again", "under a new id"):
        assert sum(words in line for line in stderr.splitlines() if f"[{ID}]" in line) == 1, words
