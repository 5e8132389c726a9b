"""Child of test_reliability_inputs.py: the outcome of vLLM's REAL engine-config build for each case, in a fresh
interpreter whose activation follows its environment (NRL_SHIM=1 or 0). `python reliability_configs.py CASES.json`;
prints one JSON line {case name: outcome}.

A case: {"name", "model", "path": bool (pass the model as a pathlib.Path), "kwargs": {...}}. Each builds
`EngineArgs(model=..., load_format="dummy", **kwargs).create_engine_config()`, as every engine entry path does, on
vLLM's CPU platform where no accelerator is found (see tests/children/vllm_configs.py). The outcome: the fields the
shim could change plus the model type vLLM resolved, or the exception's type and message and the file of the frame
that raised each exception of its chain (to tell a vLLM error from one raised inside nrl_shim).
"""

import json
import pathlib
import sys
import traceback


def raised_in(exc):
    """The file of the innermost frame of every exception in the chain (cause / context), outermost first."""
    files, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        frames = traceback.extract_tb(exc.__traceback__)
        files.append(frames[-1].filename if frames else None)
        exc = exc.__cause__ or exc.__context__
    return files


def outcome(case):
    from vllm.engine.arg_utils import EngineArgs

    model = pathlib.Path(case["model"]) if case.get("path") else case["model"]
    try:
        config = EngineArgs(model=model, load_format="dummy", **case.get("kwargs", {})).create_engine_config()
    except Exception as exc:
        return {
            "ok": False,
            "error": f"{type(exc).__module__}.{type(exc).__name__}",
            "message": str(exc)[:1000],
            "raised_in": raised_in(exc),
        }
    load_format = config.load_config.load_format
    return {
        "ok": True,
        "load_format": str(getattr(load_format, "value", load_format)),
        "model_type": getattr(config.model_config.hf_config, "model_type", None),
        "model": str(config.model_config.model),
    }


def main():
    import logging

    import nrl_shim  # activation follows the environment (NRL_SHIM=0 keeps it off)
    from nrl_shim.quirks.vllm import _common as _vllm

    logging.getLogger("vllm").setLevel(logging.ERROR)
    _vllm.use_cpu_platform_if_no_device()
    cases = json.loads(open(sys.argv[1]).read())
    out = {"active": nrl_shim.is_active(), "results": {}}
    for case in cases:
        out["results"][case["name"]] = outcome(case)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
