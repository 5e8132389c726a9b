"""Shared by the cp-* quirks (not a quirk itself): one wrapper around torch's real `context_parallel` that

- knows whether a context-parallel (CP) context is active in this process (`active()`), for guards that live in
  transformers code;
- runs the guards' hooks: `before` (raises before torch shards any buffer) and `after` (runs once torch installed its
  CP version of SDPA; returns an undo callable, run before torch restores anything);
- cleans up when the context is left by an exception: torch 2.6-2.9 (and some 2.10+ builds) have no try/finally in
  `context_parallel`, so after an exception SDPA stays CP's wrapper for the rest of the process, the DTensor dispatcher
  keeps CP's handlers and the buffers stay sharded. We restore all three, the way torch does on a normal exit.

Each CP quirk registers its hooks under its own id, so disabling one (NRL_SHIM_DISABLE) leaves the others working; the
wrapper stays on while at least one CP quirk is patched. Imported with the CP quirk modules (for cp_targets, their
TARGETS); stdlib only at top level, wrapt and torch are touched from patch() only.
"""

import contextlib
import inspect
import sys
import threading

TYPE_CHECKING = False  # `typing` is not worth importing with a quirk module
if TYPE_CHECKING:
    from typing import Any

# Where context_parallel lives: the real code on torch 2.10+, then the 2.6-2.9 module (a re-export stub on 2.10+).
# Real module first, so the stub's names can be refreshed right after. Gated on TORCH_CP by each CP quirk.
CP_MODULES = (
    "torch.distributed.tensor.experimental._context_parallel._attention",
    "torch.distributed.tensor.experimental._attention",
)
TARGETS = CP_MODULES
CURRENT, LEGACY = TARGETS  # the real code on 2.10+; the real code on 2.6-2.9 and a re-export stub on 2.10+
_ALIASES = ("torch.distributed.tensor.experimental", LEGACY)  # modules that re-export context_parallel
_LAYER = "cp-context"  # the id of our one wrapt layer on context_parallel

_lock = threading.RLock()
_hooks: dict = {}  # quirk id -> (before, after)
_depth = 0  # CP contexts currently entered in this process (torch's CP state is process-wide, so is ours)


def active():
    """True while a context_parallel context is entered anywhere in this process."""
    return _depth > 0


def install(module, quirk_id, before=None, after=None):
    """Called from a CP quirk's patch(module) for each CP target module. Raises AttributeError/ImportError for a layout
    we do not know (the core turns that into a skip with one warning)."""
    from nrl_shim.patching import wrap

    if not _is_real(module):
        _sync_aliases()  # the 2.10+ stub: the real module carries the wrapper; make the stub's name point at it
        return
    with _lock:
        _hooks[quirk_id] = (before, after)
        wrap(module, "context_parallel", _wrapper_for(module), _LAYER)
        _sync_aliases()


def uninstall(module, quirk_id):
    """Called from a CP quirk's unpatch(module). The wrapper goes when the last CP quirk is unpatched."""
    from nrl_shim.patching import unwrap

    if not hasattr(module, "context_parallel"):
        return
    with _lock:
        _hooks.pop(quirk_id, None)
        if not _hooks and _is_real(module):
            unwrap(module, "context_parallel", _LAYER)
            _sync_aliases()


def _is_real(module):
    """True when module holds the implementation of context_parallel (not a re-export)."""
    return inspect.unwrap(module.context_parallel).__globals__ is vars(module)


def _real_module():
    for name in TARGETS:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "context_parallel") and _is_real(module):
            return module
    return None


def _sync_aliases():
    # `from ..._attention import context_parallel` copies taken before we (un)wrapped: point them at the real one now.
    # Only names that still hold one of the real module's versions are touched (never a user's own replacement).
    real = _real_module()
    if real is None:
        return
    current = real.context_parallel
    for name in _ALIASES:
        alias: Any = sys.modules.get(name)  # a torch module: its names are not typed here
        if alias is None or alias is real:
            continue
        held = getattr(alias, "context_parallel", None)
        if held is not None and held is not current and inspect.unwrap(held) is inspect.unwrap(current):
            alias.context_parallel = current


def _wrapper_for(module):
    def wrapper(wrapped, instance, args, kwargs):
        return _scope(module, wrapped(*args, **kwargs))

    return wrapper


@contextlib.contextmanager
def _scope(module, cm):
    global _depth
    hooks = list(_hooks.values())
    for before, _after in hooks:
        if before:
            before()
    leftovers = _Leftovers(module, cm)
    value = cm.__enter__()
    undos = []
    try:
        for _before, after in hooks:
            if after:
                undos.append(after())
        with _lock:
            _depth += 1
        try:
            yield value
        finally:
            with _lock:
                _depth -= 1
    except BaseException:
        _undo(undos)
        leftovers.read_buffers()  # torch's generator is still suspended: its copies of the buffers are reachable
        try:
            suppressed = cm.__exit__(*sys.exc_info())
        finally:
            leftovers.restore()
        if not suppressed:
            raise
    else:
        _undo(undos)
        cm.__exit__(None, None, None)


def _undo(undos):
    for undo in reversed(undos):
        if undo:
            undo()


class _Leftovers:
    """What torch's context_parallel changes, captured on entry, so an exception exit can put it back."""

    def __init__(self, module, cm):
        import torch.nn.functional as F
        from torch.distributed.tensor import DTensor

        self.module, self.cm = module, cm
        self.sdpa = F.scaled_dot_product_attention
        self.handlers = DTensor._op_dispatcher._custom_op_handlers
        self.buffers = None

    def read_buffers(self):
        frame = _torch_frame(self.cm, inspect.unwrap(self.module.context_parallel).__code__)
        if frame is not None and "buffers" in frame.f_locals and "original_buffers" in frame.f_locals:
            self.buffers = list(zip(frame.f_locals["buffers"], frame.f_locals["original_buffers"]))

    def restore(self):
        import torch
        import torch.nn.functional as F
        from torch.distributed.tensor import DTensor

        replaced = getattr(self.module, "_replaced_functions", {})
        sdpa_left = F.scaled_dot_product_attention is not self.sdpa and F.scaled_dot_product_attention in replaced
        # 2.6-2.9 never clean up after an exception; on 2.10+ SDPA still being CP's tells that this build did not.
        if self.module.__name__ != LEGACY and not sdpa_left:
            return
        disable = getattr(self.module, "_disable_context_parallel_dispatcher_impl", None)
        if sdpa_left and disable is not None:
            disable()  # torch's own cleanup (2.10+): SDPA, DTensor handlers, CP sharding rules
        elif sdpa_left:
            F.scaled_dot_product_attention = self.sdpa
        if DTensor._op_dispatcher._custom_op_handlers is not self.handlers and self.module.__name__ == LEGACY:
            DTensor._op_dispatcher._custom_op_handlers = self.handlers
        if self.buffers is None:
            from nrl_shim import report

            report.record(  # the CP quirks' shared wrapper: no one fix's
                None,
                "warning",
                "context_parallel was left by an exception and torch did not restore the sharded "
                "buffers; nrl-shim could not find torch's copies to restore them either",
            )
            return
        with torch.no_grad():
            for buffer, original in self.buffers:
                if original is not None:
                    buffer.resize_(original.shape)
                    buffer.copy_(original)


def _torch_frame(cm, code):
    """The frame of torch's context_parallel generator behind cm (torch.no_grad wraps it in another generator)."""
    pending, seen = [getattr(cm, "gen", None)], set()
    while pending:
        gen = pending.pop()
        frame = getattr(gen, "gi_frame", None)
        if gen is None or frame is None or id(gen) in seen:
            continue
        seen.add(id(gen))
        if gen.gi_code is code:
            return frame
        pending.extend(v for v in frame.f_locals.values() if inspect.isgenerator(v))
    return None


def cp_targets(quirk_id, before=None, after=None):
    """TARGETS entries of a CP quirk for the CP modules: install its hooks on torch's context_parallel. Defined here,
    beside install/uninstall, so that no module imports this one back (the CP quirk modules import it at top level:
    stdlib only, and loaded only when a CP quirk is)."""

    def patch_cp(module, settings):
        install(module, quirk_id, before=before, after=after)

    def unpatch_cp(module):
        uninstall(module, quirk_id)

    return {name: (patch_cp, unpatch_cp) for name in CP_MODULES}
