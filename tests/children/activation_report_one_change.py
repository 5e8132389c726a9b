"""Report one change (an INFO log line, unless NRL_SHIM_LOG_LEVEL says otherwise)."""

import nrl_shim  # noqa: F401
from nrl_shim import report

report.changed("vllm-eager-recipes", "EngineArgs.enforce_eager", False, True, "why")
