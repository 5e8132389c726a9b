"""CPU stand-ins for running NeMo RL f963d9b1b's `VllmGenerationWorker` (vLLM 0.9.1's CPU build) on a machine
without a GPU. Test harness only: NeMo RL's files and vLLM's files stay as they are.

How it gets there: tests/test_nemo_rl_f963.py puts this directory on the driver's PYTHONPATH. NeMo RL forwards the
driver's whole environment to its workers (`init_ray`'s job `env_vars` and `RayWorkerGroup`'s per-actor `env_vars`
are both `dict(os.environ)`), so the vLLM actor's interpreter (a venv of its own) runs this file at start-up, as every
interpreter with this PYTHONPATH does. Nothing is imported here: each stub is applied right after vLLM itself imports
the module it changes (a post-import hook on `sys.meta_path`), and does nothing in processes that never import it
(the driver). Stdlib only.

The stubs, and why each is needed:

1. `vllm.platforms.cpu.CpuPlatform.is_sleep_mode_available()` answers True. NeMo RL hard-codes
   `vllm.LLM(..., enable_sleep_mode=True)` (its GRPO loop puts the engine to sleep while the policy trains), and
   vLLM 0.9.1's `ModelConfig` refuses that on any platform but CUDA ("Sleep mode is not supported on current
   platform."). vLLM's CPU worker already turns `sleep()`/`wake_up()` into warnings, so allowing it changes nothing
   else.
2. `vllm.v1.worker.gpu_worker.CuMemAllocator` is replaced by a no-op stand-in. With sleep mode on, the V1 worker
   (the CPU worker inherits this from the GPU one) loads the weights and allocates the KV cache inside CUDA memory
   pools (`CuMemAllocator.get_instance().use_memory_pool(tag=...)`), which need vLLM's CUDA extension. The stand-in
   reports no usage and gives plain contexts, so the model and the KV cache are allocated as without sleep mode.

Nothing else is changed: the engine is built from NeMo RL's own arguments (`load_format` from its config, `dtype=
"auto"`, `enforce_eager=True`, its `worker_extension_cls`, ...).
"""

import contextlib
import sys


class _NoCudaMemoryPools:
    """Stand-in for vLLM's CuMemAllocator (stub 2): no pools, nothing allocated through it."""

    _instance = None

    @classmethod
    def get_instance(cls):
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def get_current_usage(self):
        return 0

    def use_memory_pool(self, tag=None):
        return contextlib.nullcontext()

    def sleep(self, offload_tags=None):
        pass

    def wake_up(self, tags=None):
        pass


def _allow_sleep_mode(module):
    module.CpuPlatform.is_sleep_mode_available = lambda self: True


def _no_cuda_memory_pools(module):
    module.CuMemAllocator = _NoCudaMemoryPools


_STUBS = {"vllm.platforms.cpu": _allow_sleep_mode, "vllm.v1.worker.gpu_worker": _no_cuda_memory_pools}


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
