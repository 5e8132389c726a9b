"""This package's quirks through nrl-shim's quirk contract (import order, idempotence, restore, stacking, pickling,
signatures), in fresh interpreters against the vLLM installed here."""

from nrl_shim.testing import QuirkContract


class TestContract(QuirkContract):
    quirk_modules = ["nrl_shim_example_quirks.vllm_use_inductor"]
