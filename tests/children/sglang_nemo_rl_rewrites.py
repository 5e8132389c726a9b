"""NeMo RL HEAD's SGLang file rewrites and sglang#27948's capture flag, in this process, for
tests/test_sglang_nemo_rl_rewrites.py: `python sglang_nemo_rl_rewrites.py RUN.json`, RUN = {"mode": ..., ...}. Started
with the environment the test gives (the CPU harness and NeMo RL's source on PYTHONPATH; NRL_SHIM on or off).

- {"mode": "rewrites", "sglang_root": dir | null, "shim": bool}: NeMo RL's `_apply_sglang_compat_patches()`, what its
  SGLang worker runs at start, here. `sglang_root`: a folder holding a copy of the `sglang` package's two files NeMo
  RL rewrites, put first on sys.path (NeMo RL finds the files through `find_spec("sglang")`): without the shim its
  rewrite then lands in the copy, never in the venv. null: the installed SGLang's own files (only under the shim,
  and only once the shim has taken over NeMo RL's two rewriting functions: checked before the call). Prints the two
  files' hashes before and after, NeMo RL's error if it raised, and the shim's lines.
- {"mode": "capture"}: custom all-reduce v2's real `CustomAllReduceV2.capture()` on an instance whose kernel object (a
  C++/CUDA object, `sglang.jit_kernel.all_reduce`, which needs a GPU and NVLink) is a stand-in that records the
  capture flags it is given; `capture()` then goes on to CUDA-only calls, which raise here after the flags were set.
  Prints the flags.
"""

import hashlib
import importlib.util
import json
import logging
import os
import sys

FILES = ("srt/utils/common.py", "srt/distributed/device_communicators/custom_all_reduce_v2.py")


class ShimLines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def hashes():
    spec = importlib.util.find_spec("sglang")
    root = next(iter(spec.submodule_search_locations))
    out = {}
    for name in FILES:
        with open(os.path.join(root, *name.split("/")), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return root, out


def rewrites(run, shim_lines):
    if run.get("sglang_root"):
        sys.path.insert(0, run["sglang_root"])
    from nemo_rl.models.generation.sglang.utils import patches

    wrapped = all(
        hasattr(getattr(patches, name), "__wrapped__")
        for name in ("_patch_sglang_safe_unpickler", "_patch_sglang_custom_all_reduce_v2_tms_cudagraph")
    )
    root, before = hashes()
    error = None
    if run["shim"] and not run.get("sglang_root") and not wrapped:
        error = "not run: the shim did not take over NeMo RL's rewriting functions (the venv's files would change)"
    else:
        try:
            patches._apply_sglang_compat_patches()
        except Exception as exc:  # NeMo RL's own error (an anchor it does not find)
            error = f"{type(exc).__name__}: {exc}"
    _, after = hashes()
    return {"root": root, "wrapped": wrapped, "before": before, "after": after, "error": error}


class KernelStandIn:
    """Stands in for custom all-reduce v2's kernel object (CUDA IPC buffers; no GPU here): records the capture flags."""

    def __init__(self):
        self.flags = []

    def set_cuda_graph_capture(self, flag):
        self.flags.append(bool(flag))


def capture(run, shim_lines):
    from sglang.srt.distributed.device_communicators.custom_all_reduce_v2 import CustomAllReduceV2

    kernel = KernelStandIn()
    instance = object.__new__(CustomAllReduceV2)
    instance.disabled, instance.obj = False, kernel
    tail = None
    try:
        with instance.capture():
            flags_inside = list(kernel.flags)
    except Exception as exc:  # the CUDA-only part after the capture (torch.cuda.is_current_stream_capturing, ...)
        tail = f"{type(exc).__name__}: {exc}"
    return {"inside": flags_inside, "flags": kernel.flags, "after_capture": tail}


def main():
    with open(sys.argv[1]) as f:
        run = json.load(f)
    shim_lines = ShimLines()
    logging.getLogger("nrl_shim").addHandler(shim_lines)
    result = {"rewrites": rewrites, "capture": capture}[run["mode"]](run, shim_lines)
    active = "nrl_shim" in sys.modules and sys.modules["nrl_shim"].is_active()
    print(json.dumps({**result, "shim_active": active, "shim_lines": shim_lines.lines}), flush=True)


if __name__ == "__main__":
    main()
