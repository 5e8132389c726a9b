"""Sequence parallel (SP, a tensor-parallel style that shards activations along the sequence) and torch's context
parallel (CP) cannot be used together (NeMo RL issue #659; NeMo RL asserts on it). parallelize_module calls that apply a
SequenceParallel style are remembered (weakly, per root module); entering a CP context while such a module is alive
raises one clear error before torch shards any buffer, and so does applying SP inside a CP context.
"""

import sys

from nrl_shim.quirks.torch_cp import TORCH_CP_SINCE, TORCH_CP_VERIFIED
from nrl_shim.quirks.torch_cp._common import cp_targets

ID = "cp-sequence-parallel"
SUMMARY = "context_parallel after parallelize_module applied SequenceParallel (or the reverse) raises a clear error"
LINK = "https://github.com/NVIDIA-NeMo/RL/issues/659"
LIBRARY = "torch"
VERSIONS, VERIFIED = TORCH_CP_SINCE, TORCH_CP_VERIFIED
REQUIRES = (
    "torch.distributed.tensor.experimental._context_parallel._attention:context_parallel(mesh)",
    "torch.distributed.tensor.parallel.api:parallelize_module(module, device_mesh, parallelize_plan)",
)
_API = "torch.distributed.tensor.parallel.api"
_PACKAGE = "torch.distributed.tensor.parallel"  # re-exports parallelize_module

TYPE_CHECKING = False  # not typing's: quirk modules stay stdlib-light
if TYPE_CHECKING:
    import threading
    from typing import Any
    from weakref import WeakKeyDictionary

# Made in patch(): threading/weakref are not worth importing while no torch target is.
_applied: "WeakKeyDictionary[Any, str] | None" = None  # module parallelized with SP -> description for the error
_nested: "threading.local | None" = None  # parallelize_module recurses for dict plans; record the outermost call only


def _is_sp(style):
    return any(cls.__name__ == "SequenceParallel" for cls in type(style).__mro__)


def _sp_paths(plan):
    if isinstance(plan, dict):
        return [path for path, style in plan.items() if _is_sp(style)]
    return [""] if plan is not None and _is_sp(plan) else []  # "": the module itself


def _error(what):
    from nrl_shim.errors import UnsupportedConfigError

    return UnsupportedConfigError(
        f"context parallel + sequence parallel: {what}. Sequence parallel and torch's context parallel cannot be used "
        "together: both shard activations along the sequence dimension, and the combination is known "
        "to break (NeMo RL issue #659; NeMo RL refuses it). What you can do: turn sequence parallel off "
        "(e.g. sequence_parallel: false; tensor parallel without it works with context parallel), or set the "
        "context-parallel size to 1. "
        f"To skip this check: NRL_SHIM_DISABLE={ID}."
    )


def _describe(module, mesh, paths):
    size = f"a mesh of size {mesh.size()}" if hasattr(mesh, "size") else "the current mesh"
    where = "the whole module" if paths == [""] else "submodules " + ", ".join(repr(p) for p in paths)
    return f"{type(module).__name__} ({where}) over {size}"


def _parallelize_guard(wrapped, instance, args, kwargs):
    from nrl_shim.quirks.torch_cp import _common as _torch_cp

    applied, nested = _applied, _nested
    assert applied is not None and nested is not None  # made by patch_api() before it installed this guard
    module = args[0] if args else kwargs.get("module")
    mesh = args[1] if len(args) > 1 else kwargs.get("device_mesh")
    plan = args[2] if len(args) > 2 else kwargs.get("parallelize_plan")
    paths = _sp_paths(plan)
    if paths and _torch_cp.active():
        raise _error(
            f"parallelize_module was asked to apply SequenceParallel to {_describe(module, mesh, paths)} "
            "inside torch.distributed.tensor.experimental.context_parallel"
        )
    outermost = not getattr(nested, "depth", 0)
    nested.depth = getattr(nested, "depth", 0) + 1
    try:
        result = wrapped(*args, **kwargs)
    finally:
        nested.depth -= 1
    if paths and outermost:
        applied[module] = _describe(module, mesh, paths)
    return result


def _check_on_enter():
    applied = list(_applied.values()) if _applied is not None else []
    if applied:
        raise _error(
            "torch.distributed.tensor.experimental.context_parallel was entered in a process where "
            f"parallelize_module applied SequenceParallel to {'; '.join(applied)}"
        )


def patch_api(module, settings):
    global _applied, _nested
    import threading
    import weakref

    from nrl_shim.patching import rebind, wrap

    if _applied is None:
        _applied, _nested = weakref.WeakKeyDictionary(), threading.local()
    old = module.parallelize_module
    wrap(module, "parallelize_module", _parallelize_guard, ID)
    # The package re-exports it; imported before activation, it still holds the unwrapped function.
    rebind([sys.modules.get(_PACKAGE)], "parallelize_module", old, module.parallelize_module)


def unpatch_api(module):
    from nrl_shim.patching import rebind, unwrap

    old = module.parallelize_module
    unwrap(module, "parallelize_module", ID)
    rebind([sys.modules.get(_PACKAGE)], "parallelize_module", old, module.parallelize_module)


# The CP modules to check on entering CP; parallelize_module's module to remember (and refuse) SP.
TARGETS = {**cp_targets(ID, before=_check_on_enter), _API: (patch_api, unpatch_api)}


def describe(settings, version):
    return f"torch {version}: context_parallel with SequenceParallel applied by parallelize_module -> clear error"
