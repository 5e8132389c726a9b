"""The same change reported three times, then a different one: one log line each."""

import nrl_shim  # noqa: F401
from nrl_shim import report

for _ in range(3):
    report.changed("vllm-eager-recipes", "EngineArgs.enforce_eager", False, True, "see https://example.invalid/why")
report.changed("vllm-eager-recipes", "EngineArgs.enforce_eager", None, True, "see https://example.invalid/why")
