"""Child side of the vLLM entry-path tests: runs inside a fresh interpreter started by vllm_helpers.build(), with
argv[1] the cases (see main()); prints one JSON document.

Imports nrl_shim first (activation follows the env the test gave), selects vLLM's CPU platform, then wraps
EngineArgs.create_engine_config OUTERMOST to record what vLLM built and stop there (building the engine itself needs
vllm._C and a GPU). A path that never reaches create_engine_config records nothing, and the test fails.
Stdlib + vLLM only (no pytest here).
"""

import json
import os
import sys


class _Stop(Exception):
    """Raised by the recorder right after create_engine_config: the config is all we need."""


_RECORDS = []


def _summary(engine_args, config):
    load_format = config.load_config.load_format
    return {
        "args_type": type(engine_args).__name__,
        "load_format": str(getattr(load_format, "value", load_format)),
        "enforce_eager": bool(config.model_config.enforce_eager),
        "args_enforce_eager": engine_args.enforce_eager,
        "model_type": config.model_config.hf_config.model_type,
        "VLLM_USE_V1": os.environ.get("VLLM_USE_V1"),
    }


def _install_recorder():
    # A wrapt layer like any other tool's, so the shim's deactivate()/activate() work through it.
    import wrapt
    from vllm.engine.arg_utils import EngineArgs

    def record(wrapped, instance, args, kwargs):
        config = wrapped(*args, **kwargs)
        _RECORDS.append(_summary(instance, config))
        raise _Stop

    wrapt.wrap_function_wrapper(EngineArgs, "create_engine_config", record)


def _openai_server(model, kwargs):
    import asyncio

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.openai.api_server import build_async_engine_client_from_engine_args

    try:
        from vllm.utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    parser = FlexibleArgumentParser()
    AsyncEngineArgs.add_cli_args(parser)
    argv = ["--model", model]
    if "load_format" in kwargs:
        argv += ["--load-format", kwargs["load_format"]]
    if kwargs.get("enforce_eager"):
        argv += ["--enforce-eager"]
    engine_args = AsyncEngineArgs.from_cli_args(parser.parse_args(argv))

    async def serve():
        async with build_async_engine_client_from_engine_args(engine_args):
            pass

    asyncio.run(serve())


def run_case(case):
    """Run one entry path; return the recorded summary, or the error it raised before/instead of a config."""
    import vllm
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs

    path, model, kwargs = case["path"], case["model"], dict(case.get("kwargs", {}))
    if case.get("load_format_enum"):  # vLLM < 0.10.1: the str-enum LoadFormat
        from vllm.config import LoadFormat

        kwargs["load_format"] = LoadFormat(kwargs["load_format"])
    del _RECORDS[:]
    try:
        if path == "llm_kw":
            vllm.LLM(model=model, **kwargs)
        elif path == "llm_positional":
            vllm.LLM(model, **kwargs)
        elif path == "engine_args":
            EngineArgs(model=model, **kwargs).create_engine_config()
        elif path == "async_engine_args":
            AsyncEngineArgs(model=model, **kwargs).create_engine_config()
        elif path == "async_llm":
            from vllm.v1.engine.async_llm import AsyncLLM

            AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **kwargs))
        elif path == "async_llm_engine":
            from vllm.engine.async_llm_engine import AsyncLLMEngine

            AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=model, **kwargs))
        elif path == "openai_server":
            _openai_server(model, kwargs)
        else:
            raise ValueError(path)
    except _Stop:
        return dict(_RECORDS[-1], path=path)
    except Exception as exc:
        from nrl_shim import ShimError

        return {
            "path": path,
            "error": type(exc).__name__,
            "shim_error": isinstance(exc, ShimError),
            "message": str(exc),
            "records": list(_RECORDS),
        }
    return {"path": path, "error": "no create_engine_config call", "records": list(_RECORDS)}


def _engine_classes():
    """Where vllm.engine's LLMEngine / AsyncLLMEngine names point (0.8-0.10 pick V0 or V1 at import time)."""
    import importlib

    found = {}
    for module, name in (("vllm.engine.llm_engine", "LLMEngine"), ("vllm.engine.async_llm_engine", "AsyncLLMEngine")):
        try:
            found[name] = getattr(importlib.import_module(module), name).__module__
        except Exception:
            found[name] = None
    return found


def _envs_use_v1():
    import vllm.envs

    try:
        return bool(vllm.envs.VLLM_USE_V1)
    except AttributeError:  # vLLM >= 0.11.1: no such variable
        return None


def _reactivate(env, argv, unset=()):
    """Start a phase: the shim off, NRL_* replaced by `env`, then activated again from os.environ (as at start-up)."""
    import nrl_shim

    nrl_shim.deactivate()
    for name in [n for n in os.environ if n.startswith("NRL_")]:
        del os.environ[name]
    for name in unset:
        os.environ.pop(name, None)
    os.environ.update(env)
    if argv is not None:
        sys.argv[1:] = argv
    if env.get("NRL_SHIM", "1") != "0":
        nrl_shim.activate()


def main():
    """argv[1]: JSON list of cases, or {"phases": [{"env": {...}, "argv": [...], "cases": [...]}, ...]}.
    A phase with "env" re-activates the shim with that environment; the first phase may omit it (start-up state)."""
    import logging

    import nrl_shim
    from nrl_shim.quirks.vllm import _common as _vllm

    logging.getLogger("vllm").setLevel(logging.ERROR)
    _vllm.use_cpu_platform_if_no_device()
    out = {"phases": [], "import_env": os.environ.get("VLLM_USE_V1"), "engine_classes": _engine_classes()}
    _install_recorder()
    spec = json.loads(sys.argv[1])
    phases = spec["phases"] if isinstance(spec, dict) else [{"cases": spec}]
    for phase in phases:
        if "env" in phase:
            _reactivate(phase["env"], phase.get("argv"), phase.get("unset", ()))
        results = [dict(run_case(case), case=case) for case in phase["cases"]]
        out["phases"].append(
            {
                "results": results,
                "active": nrl_shim.is_active(),
                "patched": [list(p) for p in nrl_shim.activation.patched()],
                "env_after": os.environ.get("VLLM_USE_V1"),
                "envs_use_v1": _envs_use_v1(),
                "recipe_env": os.environ.get("NRL_SHIM_RECIPE"),
            }
        )
    out["results"] = out["phases"][0]["results"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
