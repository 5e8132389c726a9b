"""Child side of `nrl-shim explain`: build ONE real vLLM engine config and print it as JSON (flattened fields).

Run as `python -m nrl_shim.explain.child '<json request>'` with NRL_SHIM=1 or NRL_SHIM=0 in the environment.
`import nrl_shim` comes first, so activation follows that environment exactly as in a user's process.
"""

import dataclasses
import enum
import json
import os
import re
import sys

_MAX_DEPTH = 3
_MAX_REPR = 160


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _leaf(value):
    if isinstance(value, enum.Enum):
        return value.name if not isinstance(value, str) else str(value.value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (set, frozenset)):
        value = sorted(value, key=repr)  # set order changes from process to process
    text = _ADDRESS.sub("", repr(value))
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _field_names(obj):
    """Field names of a config object: dataclasses (VllmConfig, most configs), pydantic models, and the plain
    classes vllm.config used on 0.8.x; None for anything else (a leaf)."""
    if isinstance(obj, (type, enum.Enum, str, int, float, bytes)):
        return None
    if dataclasses.is_dataclass(obj):
        return [field.name for field in dataclasses.fields(obj)]
    if isinstance(getattr(type(obj), "model_fields", None), dict):
        return list(type(obj).model_fields)
    if type(obj).__module__.startswith("vllm.config") and hasattr(obj, "__dict__"):
        return [name for name in vars(obj) if not name.startswith("_")]
    return None


def flatten(obj, prefix="", depth=0, out=None):
    """{dotted field name: JSON-able value} for a config tree such as VllmConfig."""
    out = {} if out is None else out
    names = _field_names(obj) if depth < _MAX_DEPTH else None
    if names is not None:
        for name in names:
            try:
                value = getattr(obj, name)
            except Exception as exc:  # a property-like field that fails on CPU: say so instead of failing
                value = f"<unavailable: {type(exc).__name__}>"
            flatten(value, f"{prefix}{name}.", depth + 1, out)
        return out
    if depth < _MAX_DEPTH and isinstance(obj, dict) and all(isinstance(k, str) for k in obj) and len(obj) <= 32:
        for key, value in sorted(obj.items()):
            flatten(value, f"{prefix}{key}.", depth + 1, out)
        if obj:
            return out
    out[prefix[:-1]] = _leaf(obj)
    return out


def main(argv=None):
    request = json.loads((argv or sys.argv[1:])[0])
    import nrl_shim
    from nrl_shim import report

    changes = []
    original_changed = report.changed

    def recording_changed(quirk_id, what, before, after, why):
        change = {"quirk": quirk_id, "what": what, "before": _leaf(before), "after": _leaf(after), "why": why}
        if change not in changes:  # report.changed logs each once a process; so does the list
            changes.append(change)
        return original_changed(quirk_id, what, before, after, why)

    report.changed = recording_changed
    names = request.get("env_names") or ["VLLM_USE_V1"]
    env_before = {name: os.environ.get(name) for name in names}
    try:
        import logging

        from nrl_shim.quirks.vllm import _common as _vllm

        logging.getLogger("vllm").setLevel(logging.ERROR)
        platform = _vllm.use_cpu_platform_if_no_device()
        env_at_import = {name: os.environ.get(name) for name in names}
        from vllm.engine.arg_utils import EngineArgs

        engine_args = EngineArgs(model=request["model"], **request.get("engine_args", {}))
        config = engine_args.create_engine_config()
        result = {"config": flatten(config), "model_type": config.model_config.hf_config.model_type}
    except Exception as exc:
        result = {
            "error": f"{type(exc).__name__}: {exc}",
            "error_type": type(exc).__name__,
            "shim_error": isinstance(exc, nrl_shim.ShimError),
        }
        platform = locals().get("platform")
        env_at_import = locals().get("env_at_import") or {}
    result.update(
        shim_active=nrl_shim.is_active(),
        changes=changes,
        platform=platform,
        vllm=_vllm_version(),
        env={
            name: {
                "before": env_before[name],
                "after": os.environ.get(name),
                "at_import": env_at_import.get(name),
            }
            for name in names
        },
    )
    sys.stdout.write("\n" + json.dumps(result, default=str) + "\n")
    return 0


def _vllm_version():
    from nrl_shim.quirks.vllm._common import installed_version

    return installed_version()


if __name__ == "__main__":
    sys.exit(main())
