"""sglang-quantized-refit-guard on a real SGLang 0.5.12.post1 or 0.5.10.post1 engine (`sglang.Engine`, CPU;
tests/children/sglang_engine.py) holding a tiny Llama quantized online to FP8 (`quantization="fp8"`, bfloat16): one
layer's weight sent by `update_weights_from_tensor` (the route NeMo RL, slime and verl refit by). Without the shim
the update answers success and the layer serves the new values cast to FP8 under the old weights' scale (not
re-quantized: its output is off by that scale), nothing said; under the shim one WARNING names it; in strict mode the
update answers failure with that message.

Runs where the bug exists and FP8 runs here: SGLang < 0.5.21 (`nox -s sglang_nemo_rl`, `nox -s sglang_areal`). From
0.5.21 the fix is not affected (the release post-processes at end_weight_update), and FP8 layers need Intel AMX kernels
there, which the harness has not (tests/sglang_cpu/README.md): skipped, saying so. No generation: FP8 activations need
Triton.
"""

import sys

import pytest
from packaging.version import Version

from conftest import child_path, run_case
from sglang_helpers import ENGINE_KW, REAL_SGLANG, SGLANG_VERSION, sglang_env, write_llama

ID = "sglang-quantized-refit-guard"
LAYER = "model.layers.0.self_attn.o_proj"  # square: the new values fit the processed (transposed) parameter
pytestmark = [
    *REAL_SGLANG,
    pytest.mark.full,
    pytest.mark.skipif(
        SGLANG_VERSION is not None and Version(SGLANG_VERSION) >= Version("0.5.21"),
        reason="SGLang >= 0.5.21 re-processes quantized layers itself, and its FP8 layers need AMX kernels on a CPU",
    ),
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang-fp8")
    return write_llama(root / "a", seed=0), write_llama(root / "b", seed=1)


FP8_MAX = 448.0  # float8_e4m3fn: a per-tensor quantization maps the tensor's largest magnitude here


def _run(checkpoints, tmp_path, env):
    a, b = checkpoints
    weight = [f"{LAYER}.weight"]
    cases = [
        {"kind": "weights", "names": weight},
        {"kind": "update_from_tensor", "checkpoint": b, "flush_cache": True, "only": weight, "dtype": "bfloat16"},
        {"kind": "weights", "names": weight},
    ]
    engine = {**ENGINE_KW, "model_path": a, "dtype": "bfloat16", "quantization": "fp8"}
    out, proc = run_case(child_path("sglang_engine"), {"engine": engine, "cases": cases}, tmp_path, env=sglang_env(env))
    lines = [line for line in proc.stderr.splitlines() if f"[{ID}]" in line]
    print(
        f"SGLang {out['sglang']} FP8 engine: start {out['engine_start_s']:.0f} s; guard lines {lines}", file=sys.stderr
    )
    before, update, after = (case["result"] for case in out["cases"])
    return {"before": before[weight[0]], "update": update["update"], "after": after[weight[0]], "lines": lines}


def test_update_is_not_requantized_without_the_shim(checkpoints, tmp_path):
    """The layer's FP8 weight as SGLang holds it (get_weights_by_name reads the first rows): quantized at load (its
    largest magnitude at FP8's maximum: those rows reach hundreds; the scale beside it); after the update the new values cast as they are, at
    their own magnitude (< 1 here), under the old scale: not re-quantized."""
    from safetensors.torch import load_file

    run = _run(checkpoints, tmp_path, {"NRL_SHIM": "0"})
    assert run["update"][0] is True, run["update"]  # SGLang answers success
    assert max(map(abs, run["before"])) > FP8_MAX / 4, max(map(abs, run["before"]))  # processed at load
    new = load_file(f"{checkpoints[1]}/model.safetensors")[f"{LAYER}.weight"].float()
    largest = max(map(abs, run["after"]))
    assert largest <= float(new.abs().max()) * 1.1, largest  # the raw new values, far from FP8's range
    assert not run["lines"]


def test_update_named_under_the_shim(checkpoints, tmp_path):
    run = _run(checkpoints, tmp_path, {"NRL_SHIM": "1"})
    assert run["update"][0] is True, run["update"]  # not strict: the update's answer is SGLang's
    assert len([line for line in run["lines"] if "WARNING" in line]) == 1, run["lines"]
    assert "quantized with fp8" in run["lines"][0] and "update_weights_from_tensor" in run["lines"][0]


def test_strict_fails_the_update(checkpoints, tmp_path):
    run = _run(checkpoints, tmp_path, {"NRL_SHIM": "1", "NRL_SHIM_STRICT": "1"})
    success, message = run["update"]
    assert success is False and ID in message and "tensors are written" in message, run["update"]
