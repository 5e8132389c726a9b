"""A CPU platform for verl 0.9.1, registered through verl's own extension point: verl imports this module when
`VERL_USE_EXTERNAL_MODULES=verl_cpu_platform` (verl/__init__.py) and picks it with `VERL_PLATFORM=cpu`
(verl/plugin/platform/platform_manager.py). Test harness only; nothing in verl's files changes. verl has no CPU
platform of its own, and every method below is what verl's CUDA platform does, minus CUDA:

- device "cpu"; the device module is `torch.cpu` plus no-op synchronize/empty_cache/ipc_collect (verl calls them
  around a refit; `torch.cpu` has no empty_cache); seeding and allocator settings are the CPU equivalents or no-ops;
- `is_ipc_supported() -> False`: verl's refit then uses its shared-memory transport (`/dev/shm/verl_weights_*`), the
  path verl itself takes on devices without CUDA IPC;
- `ray_resource_name() -> "GPU"`: `vLLMReplica.launch_servers` reads `get_accelerator_ids()["GPU"][0]` of the trainer
  actor, so the test's Ray cluster offers one logical GPU (`num_gpus=1`); nothing uses CUDA;
- `rollout_env_vars()` returns `VERL_CPU_TEST_ACTOR_VAR`: verl passes it as the rollout server actor's own
  `runtime_env={"env_vars": ...}` (actor level), so the test can see that an actor-level variable verl sets is kept.
"""

import os
import types
from contextlib import contextmanager

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

ACTOR_VAR = "VERL_CPU_TEST_ACTOR_VAR"

# `torch.cpu` lacks the cache calls verl makes on its device module around a refit (empty_cache, ipc_collect).
DEVICE_MODULE = types.SimpleNamespace(
    **{
        **{name: getattr(torch.cpu, name) for name in dir(torch.cpu) if not name.startswith("_")},
        **{name: (lambda *args, **kwargs: None) for name in ("synchronize", "empty_cache", "ipc_collect")},
    }
)


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    @property
    def device_name(self):
        return "cpu"

    @property
    def vendor_name(self):
        return "cpu"

    @property
    def device_module(self):
        return DEVICE_MODULE

    def is_available(self):
        return True

    def current_device(self):
        return 0

    def device_count(self):
        return 1

    def set_device(self, device_index):
        pass

    def synchronize(self, device_index=None):
        pass

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings):
        pass

    def empty_cache(self):
        pass

    def get_device_capability(self, device_index=0):
        return None, None

    def communication_backend_name(self):
        return "gloo"

    def visible_devices_envvar(self):
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg):
        yield

    def profiler_start(self):
        pass

    def profiler_stop(self):
        pass

    def ray_resource_name(self):
        return "GPU"

    def ray_noset_envvars(self):
        return []

    def is_ipc_supported(self):
        return False

    def rollout_env_vars(self):
        return {ACTOR_VAR: os.environ.get(ACTOR_VAR, "actor-level")}

    def cudart(self):
        return None
