"""The refit fixes that wrap a model's own load_weights (vllm-refit-guard, vllm-prefix-cache-refit, the refit probe (vllm-weights-probe),
vllm-layerwise-refit) each hold a layer of nrl_shim.patching on the model instance: on vLLM's real model object (a
tiny Qwen3-MoE loaded with dummy weights through vLLM's own loader, no engine: tests/children/
refit_fixes_unwrap_order.py), loaded, refit and then taken off in every order, each removal takes off that fix's layer
and only it, and at the end the model has its own class's load_weights back and no hook of theirs stays. (Before,
each fix put back the load_weights it had found: taken off in another order than the reverse of how they were added,
that could put a stopped fix's wrapper back.)"""

import itertools

from vllm_object_tests import requires

from nrl_shim.quirks.vllm.refit import layerwise_refit

from conftest import run_child_json

IDS = ["vllm-layerwise-refit", "vllm-prefix-cache-refit", "vllm-refit-guard", "vllm-weights-probe"]


@requires(layerwise_refit.VERSIONS)
def test_refit_fixes_come_off_in_every_order_and_leave_the_models_own_load_weights(tmp_path):
    out, _ = run_child_json(
        "refit_fixes_unwrap_order", str(tmp_path), env={"NRL_SHIM": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}, timeout=900
    )
    runs = out["runs"]
    assert [run["order"] for run in runs] == [list(order) for order in itertools.permutations(IDS)]
    for run in runs:
        assert run["loaded"] == run["after_refit"] == IDS, run  # all four watch this model, through its refit
        assert run["hooks_after_refit"] == 2, run  # the guard's check and the layerwise bracket's close, armed
        left = list(IDS)
        for quirk_id, still_on in zip(run["order"], run["steps"]):
            left.remove(quirk_id)
            assert still_on == left, run  # that fix's layer off, the others' on
        assert run["own_attribute"] is False and run["class_method"] is True and run["hooks"] == 0, run
