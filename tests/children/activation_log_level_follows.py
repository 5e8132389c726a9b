"""NRL_SHIM_LOG_LEVEL changed between deactivate() and activate(): the new level holds for what follows."""

import os

import nrl_shim
from nrl_shim import report

report.changed("vllm-eager-recipes", "first", False, True, "why")
nrl_shim.deactivate()
os.environ["NRL_SHIM_LOG_LEVEL"] = "ERROR"
settings = nrl_shim.activate()
import logging  # noqa: E402

print(settings.log_level, logging.getLogger("nrl_shim").level)
report.changed("vllm-eager-recipes", "second", False, True, "why")
