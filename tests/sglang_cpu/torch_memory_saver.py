"""Stand-in for torch_memory_saver (PyPI `torch-memory-saver`) on a CPU machine: README.md beside this file.

The real package is a CUDA virtual-memory allocator: tensors allocated inside `region(tag)` live in pauseable memory;
`pause(tag)` unmaps it (the GPU memory goes back to the trainer) and `resume(tag)` maps fresh memory at the same
addresses, with the old contents only where the region asked for `enable_cpu_backup`. It needs CUDA and does not
load here, so SGLang's `--enable-memory-saver` cannot start on a CPU. This stand-in keeps the part SGLang's weight
release/resume depends on, what the tensors hold afterwards: every tensor an operator creates inside a region is
recorded (a TorchDispatchMode, in the region only); `pause(tag)` copies them aside when the region asked for a
backup and zeroes them (their memory is gone); `resume(tag)` puts the copies back, and leaves the others zeroed (fresh
memory: on a GPU it holds whatever the pages hold). Memory itself is not released: nothing to give back on a CPU.
"""

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_TAG_DEFAULT = "default"


class _Record(TorchDispatchMode):
    """Records the tensors operators create (not views of tensors already seen) while a region is open."""

    def __init__(self, into):
        super().__init__()
        self.into = into

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu" and not tensor.is_sparse:
                storage = tensor.untyped_storage()
                if storage.nbytes() and storage.data_ptr() not in self.into:
                    # the whole storage, as a flat byte tensor: what the allocator handed out
                    self.into[storage.data_ptr()] = torch.empty(0, dtype=torch.uint8).set_(storage)
        return out


class TorchMemorySaver:
    def __init__(self):
        self._regions = []  # (tag, enable_cpu_backup, {data_ptr: byte tensor})
        self._backups = {}  # id of a region's record -> {data_ptr: copy}
        self._disabled = False

    @contextlib.contextmanager
    def region(self, tag=_TAG_DEFAULT, enable_cpu_backup=False, enable_disk_backup=False, cpu_backup_backend=None):
        record = {}
        self._regions.append((tag, enable_cpu_backup or enable_disk_backup, record))
        with _Record(record):
            yield

    @contextlib.contextmanager
    def cuda_graph(self, *args, **kwargs):
        raise NotImplementedError("torch_memory_saver stand-in: no CUDA graphs on a CPU")
        yield

    @contextlib.contextmanager
    def disable(self):
        yield

    def _tagged(self, tag):
        return [region for region in self._regions if tag is None or region[0] == tag]

    def pause(self, tag=None):
        for _tag, backup, record in self._tagged(tag):
            if backup:
                self._backups[id(record)] = {ptr: t.clone() for ptr, t in record.items()}
            for t in record.values():
                t.zero_()

    def resume(self, tag=None):
        for _tag, _backup, record in self._tagged(tag):
            for ptr, copy in self._backups.pop(id(record), {}).items():
                record[ptr].copy_(copy)

    @property
    def enabled(self):
        return True

    @property
    def hook_mode(self):
        raise AttributeError

    @hook_mode.setter
    def hook_mode(self, hook_mode):
        pass


@contextlib.contextmanager
def configure_subprocess():
    """The real one LD_PRELOADs its allocator into SGLang's scheduler processes; nothing to preload here."""
    yield


torch_memory_saver = TorchMemorySaver()
