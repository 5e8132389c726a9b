"""NeMo RL's rewrites of SGLang's installed files, done in memory in every process instead.

At worker start NeMo RL HEAD (`nemo_rl/models/generation/sglang/utils/patches.py`, `_apply_sglang_compat_patches`)
rewrites two files of the SGLang in its venv (`os.replace` into site-packages), so that every SGLang process it starts
afterwards imports the changed code:
- `sglang/srt/utils/common.py`: `SafeUnpickler`'s allowlist gets NeMo RL's weight-bucket metadata module. NeMo RL
  sends its refit buckets (`load_format="flattened_bucket"`) with metadata objects of its own copy of SGLang's class,
  `nemo_rl.models.generation.sglang.utils.train_utils.FlattenedTensorMetadata`, which SGLang's unpickler refuses
  (measured: the update fails, "Blocked unsafe class loading", and NeMo RL raises "Weight sync failed"). The
  rewrite's anchor (`"torch.nn.parameter.",` in ALLOWED_MODULE_PREFIXES) is gone from 0.5.2x's exact table
  (ALLOWED_GLOBALS): there NeMo RL's worker raises at start.
- `sglang/srt/distributed/device_communicators/custom_all_reduce_v2.py`: a backport of sglang#27948 (with
  `SGLANG_MEMORY_SAVER_CUDA_GRAPH`, CUDA graphs captured with torch_memory_saver, custom all-reduce v2 must not flag its
  kernel as capturing: its registered IPC addresses go stale). Releases that have the fix lack NeMo RL's anchors, and
  NeMo RL's worker raises there too.
A rewritten file stays rewritten for every later job of that venv and image, and a read-only or shared site-packages
(a container layer, a cluster-wide venv) fails the worker.

The fix, in memory, in every process of the job (NeMo RL's actor and SGLang's server, scheduler and TP processes):
- SGLang's `SafeUnpickler.find_class` resolves exactly one more global, NeMo RL's `FlattenedTensorMetadata` (a
  dataclass of names, shapes and offsets; not its module, which also holds functions), on both allowlist layouts
  (prefixes up to 0.5.1x, the exact table after). Logged once per process where such a bucket is read.
- Where the release lacks sglang#27948 (its custom_all_reduce_v2.py does not read `SGLANG_MEMORY_SAVER_CUDA_GRAPH`),
  the backport: with that variable on, custom all-reduce v2 keeps its capture flag off (`set_cuda_graph_capture(True)`
  becomes `(False)`, what the backport's `not self.tms_cudagraph` gives). Releases with the fix: nothing to do.
- NeMo RL's two rewriting functions are not run (each logged once, before -> after): nothing is written under
  site-packages, and NeMo RL's worker no longer raises on releases where its anchors are gone.
NeMo RL's third change, the TP memory-imbalance variables, only sets the environment: its worker already sets
`SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=false`, the name every release 0.5.10 -> 0.5.23 reads; left as it is.
slime's allowlist entry (a blanket `slime.` prefix its Docker image patches into SGLang's source) is not taken over:
upstream slime's refit sends SGLang's own classes, so none of slime's crosses SGLang's unpickler (docs/sglang.md).
"""

from nrl_shim.quirks.sglang import SGLANG_SINCE, SGLANG_VERIFIED

ID = "sglang-nemo-rl-rewrites"
SUMMARY = (
    "NeMo RL's rewrites of SGLang's installed files (unpickler allowlist, all-reduce backport) done in memory in every "
    "process; nothing written under site-packages"
)
LINK = "https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/generation/sglang/utils/patches.py"
LIBRARY = "sglang"
# Read in the wheels 0.5.10 -> 0.5.23 (SafeUnpickler's two allowlist layouts; custom_all_reduce_v2.py without and
# with sglang#27948's SGLANG_MEMORY_SAVER_CUDA_GRAPH), and in NeMo RL HEAD (7ea279abf). The unpickler part run on
# real servers of 0.5.10.post1, 0.5.12.post1 and 0.5.23 with NeMo RL's own bucket sender; the backport run on
# 0.5.12.post1's and 0.5.10.post1's real CustomAllReduceV2.capture with a stand-in for its CUDA kernel object (no GPU).
VERSIONS, VERIFIED = SGLANG_SINCE, SGLANG_VERIFIED
_COMMON = "sglang.srt.utils.common"
_ALL_REDUCE = "sglang.srt.distributed.device_communicators.custom_all_reduce_v2"
_NEMO_RL = "nemo_rl.models.generation.sglang.utils.patches"
REQUIRES = (f"{_COMMON}:SafeUnpickler.find_class(module, name)",)
# The one global added to SGLang's unpickler: NeMo RL's copy of SGLang's FlattenedTensorMetadata.
NEMO_RL_METADATA = ("nemo_rl.models.generation.sglang.utils.train_utils", "FlattenedTensorMetadata")
# What marks a custom_all_reduce_v2.py that has sglang#27948 (0.5.2x reads it there).
TMS_VARIABLE = "SGLANG_MEMORY_SAVER_CUDA_GRAPH"
_WHY = (
    "NeMo RL rewrites SGLang's installed file for it at worker start; the shim does it in memory in every process, "
    f"so site-packages stays as installed; see {LINK}"
)


def describe(settings, version):
    return (
        "NeMo RL's bucket metadata class allowed in SGLang's unpickler; sglang#27948's all-reduce backport where the "
        "release lacks it; NeMo RL's file rewrites not run"
    )


# --- SGLang's unpickler ---


def _patch_common(module, settings):
    from nrl_shim.patching import wrap

    wrap(module.SafeUnpickler, "find_class", _find_class_wrapper, ID)


def _unpatch_common(module):
    from nrl_shim.patching import unwrap

    unwrap(module.SafeUnpickler, "find_class", ID)


def _find_class_wrapper(wrapped, instance, args, kwargs):
    module = args[0] if args else kwargs.get("module")
    name = args[1] if len(args) > 1 else kwargs.get("name")
    if (module, name) != NEMO_RL_METADATA:
        return wrapped(*args, **kwargs)
    import pickle

    from nrl_shim import report

    report.changed(
        ID,
        "SGLang SafeUnpickler allowlist",
        f"{module}.{name} blocked",
        f"{module}.{name} allowed (this one class, in memory)",
        f"NeMo RL's flattened weight buckets carry it; {_WHY}",
    )
    return pickle.Unpickler.find_class(instance, module, name)


# --- sglang#27948, where the release lacks it ---


def _has_upstream_fix(module) -> bool:
    import inspect

    try:
        return TMS_VARIABLE in inspect.getsource(module)
    except (OSError, TypeError):
        return True  # no source to read: leave the release as it is


def _patch_all_reduce(module, settings):
    if _has_upstream_fix(module):
        return
    from nrl_shim.patching import wrap

    for method in ("capture", "custom_all_reduce"):
        wrap(module.CustomAllReduceV2, method, _tms_capture_flag_wrapper, ID)


def _unpatch_all_reduce(module):
    from nrl_shim.patching import unwrap

    for method in ("capture", "custom_all_reduce"):
        unwrap(module.CustomAllReduceV2, method, ID)


class TmsCaptureFlag:
    """Custom all-reduce v2's kernel object with the backport's capture flag: `set_cuda_graph_capture(True)` sets it
    off (what `not self.tms_cudagraph` gives with torch_memory_saver's CUDA graphs); everything else as it is."""

    def __init__(self, kernel):
        self._kernel = kernel

    def set_cuda_graph_capture(self, flag):
        return self._kernel.set_cuda_graph_capture(False)

    def __getattr__(self, name):
        return getattr(self._kernel, name)


def _tms_capture_flag_wrapper(wrapped, instance, args, kwargs):
    kernel = getattr(instance, "obj", None)
    if kernel is not None and not isinstance(kernel, TmsCaptureFlag) and not getattr(instance, "disabled", True):
        from sglang.srt.environ import envs

        if getattr(envs, TMS_VARIABLE).get():
            from nrl_shim import report

            instance.obj = TmsCaptureFlag(kernel)
            report.changed(
                ID,
                f"SGLang custom all-reduce v2 capture flag ({TMS_VARIABLE} on)",
                "set while CUDA graphs are captured",
                "off (sglang#27948, backported in memory)",
                f"torch_memory_saver replaces the addresses the kernel registers during capture; {_WHY}",
            )
    return wrapped(*args, **kwargs)


# --- NeMo RL's rewriting functions ---


def _patch_nemo_rl(module, settings):
    from nrl_shim import report
    from nrl_shim.patching import wrap

    for name, wrapper in _NEMO_RL_REWRITES.items():
        if callable(getattr(module, name, None)):
            wrap(module, name, wrapper, ID)
        else:  # another NeMo RL: its own code decides (a REQUIRES name would skip the whole fix for it)
            report.warn_once(
                ID,
                name,
                f"[{ID}] {module.__name__} has no {name}: that rewrite of this NeMo RL is not taken over (if it "
                "rewrites SGLang's files another way, it still does); SGLang's side of the fix acts as before",
            )


def _unpatch_nemo_rl(module):
    from nrl_shim.patching import unwrap

    for name in _NEMO_RL_REWRITES:
        if hasattr(module, name):
            unwrap(module, name, ID)


def _sglang_file_has(relative_path: str, marker: str) -> "bool | None":
    """Whether the installed SGLang's file holds `marker` (None: no such file), read without importing SGLang."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("sglang")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, *relative_path.split("/"))
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                return marker in f.read()
    return None


def _skip_unpickler_rewrite(wrapped, instance, args, kwargs):
    from nrl_shim import report

    report.changed(
        ID,
        "NeMo RL's rewrite of sglang/srt/utils/common.py (SafeUnpickler allowlist)",
        "written into site-packages",
        "not written: NeMo RL's FlattenedTensorMetadata is allowed in memory in every SGLang process the shim runs in",
        _WHY,
    )


def _skip_all_reduce_rewrite(wrapped, instance, args, kwargs):
    from nrl_shim import report

    has_fix = _sglang_file_has("srt/distributed/device_communicators/custom_all_reduce_v2.py", TMS_VARIABLE)
    after = (
        "not written: this SGLang release has sglang#27948 (NeMo RL's anchors are gone; its rewrite would raise)"
        if has_fix or has_fix is None
        else "not written: the backport is applied in memory in every SGLang process the shim runs in"
    )
    report.changed(
        ID,
        "NeMo RL's rewrite of sglang/srt/distributed/device_communicators/custom_all_reduce_v2.py (sglang#27948)",
        "written into site-packages",
        after,
        _WHY,
    )


_NEMO_RL_REWRITES = {
    "_patch_sglang_safe_unpickler": _skip_unpickler_rewrite,
    "_patch_sglang_custom_all_reduce_v2_tms_cudagraph": _skip_all_reduce_rewrite,
}

TARGETS = {
    _COMMON: (_patch_common, _unpatch_common),
    _ALL_REDUCE: (_patch_all_reduce, _unpatch_all_reduce),
    _NEMO_RL: (_patch_nemo_rl, _unpatch_nemo_rl),
}
