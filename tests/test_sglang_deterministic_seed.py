"""sglang-deterministic-seed on SGLang's own classes (tests/children/sglang_deterministic_seeds.py: its Req objects,
its published settings, its batch builder's seed tensor; deterministic inference itself needs GPU kernels and does not
start on a CPU): a GRPO group of 8 requests without a seed gets seed 42 eight times without the shim (SGLang's
seeded sampler then draws the same noise for each at every position: identical samples), eight distinct seeds with
it; a request's own seed is kept either way; with deterministic inference off the shim sets nothing (SGLang builds no
seed tensor).
"""

import pytest

from conftest import run_child_json
from sglang_helpers import REAL_SGLANG, sglang_env, write_llama

ID = "sglang-deterministic-seed"
GROUP, OWN_SEED = 8, 7  # the child's


def real_sglang(test):
    for mark in REAL_SGLANG:
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    checkpoint = write_llama(tmp_path_factory.mktemp("llama"), seed=0)
    runs = {}
    for shim in (False, True):
        env = sglang_env({"NRL_SHIM": "1" if shim else "0", "NRL_SHIM_LOG_LEVEL": "INFO"})
        out, proc = run_child_json("sglang_deterministic_seeds", checkpoint, env=env)
        runs[shim] = {**out, "log": proc.stdout + proc.stderr}
    return runs


@real_sglang
def test_a_group_without_seeds_shares_seed_42_without_the_shim(seeds):
    on = seeds[False]["on"]
    assert on["batch_seeds"] == [42] * GROUP + [OWN_SEED], on
    assert f"[{ID}]" not in seeds[False]["log"]


@real_sglang
def test_each_request_gets_its_own_seed_under_the_shim(seeds):
    on = seeds[True]["on"]
    group = on["batch_seeds"][:GROUP]
    assert len(set(group)) == GROUP and 42 not in group, on
    assert all(0 <= seed < 2**63 for seed in group), on  # SGLang's int64 seeds
    assert on["batch_seeds"][GROUP] == OWN_SEED, on  # a request's own seed kept
    assert on["request_seeds"] == on["batch_seeds"], on  # the builder read the requests' seeds
    said = [line for line in seeds[True]["log"].splitlines() if f"[{ID}]" in line]
    assert len(said) == 1 and "derived from the request id" in said[0], said


@real_sglang
def test_nothing_is_set_with_deterministic_inference_off(seeds):
    for shim in (False, True):
        off = seeds[shim]["off"]
        assert off["batch_seeds"] is None, off
        assert off["request_seeds"] == [None] * GROUP + [OWN_SEED], off
