"""PyPI's torchvision next to torch +cpu, imported untouched (README.md beside this file).

PyPI's torchvision is a CUDA build: its `_C.so` needs libtorch_cuda and does not load next to torch +cpu, which
torchvision tolerates (its ops then raise when called), except that `torchvision/_meta_registrations.py` registers fake
kernels for `torchvision::nms` and `torchvision::qnms` unconditionally, and `torch.library.register_fake` refuses an
operator that was never defined ("operator torchvision::nms does not exist"). Defining those two schemas (the ones
torchvision's C++ library declares) before torchvision is first imported lets that file run as it is. No kernel is
registered: called, the ops fail ("could not run ... with arguments from the 'CPU' backend"), as torchvision's own
`_assert_has_ops` makes its Python wrappers fail first. Nothing is imported until torchvision is.

`install()` puts the finder in place: sitecustomize.py does it in every process of an engine under test, and
tests/sglang_helpers.py in the test process (which writes checkpoints and computes references with transformers).
"""

import importlib.abc
import importlib.util
import os
import sys

# The two operators torchvision's fake registrations need defined, with the schemas of its C++ library (nms.cpp).
TORCHVISION_SCHEMAS = {
    "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


class TorchvisionOpSchemas(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the first import of torchvision it defines the missing schemas, where torchvision's
    own extension does not load, and lets the ordinary finders import the package."""

    def __init__(self) -> None:
        self.done = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision" or self.done:
            return None
        self.done = True  # stays in sys.meta_path (removing it while the import system walks the list skips a finder)
        define_missing_torchvision_ops()
        return None


def define_missing_torchvision_ops() -> list[str]:
    """Define torchvision::nms/qnms unless torchvision's `_C` library loads here (then it defines them itself);
    returns the operators defined."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return []
    import torch

    try:
        torch.ops.load_library(os.path.join(list(spec.submodule_search_locations)[0], "_C.so"))
        return []
    except (OSError, ImportError):
        pass
    defined = []
    for name, schema in TORCHVISION_SCHEMAS.items():
        if not hasattr(torch.ops.torchvision, name):
            torch.library.define(f"torchvision::{name}", schema)
            defined.append(name)
    return defined


def install() -> None:
    """Put the finder first on sys.meta_path (once per process)."""
    if not any(isinstance(finder, TorchvisionOpSchemas) for finder in sys.meta_path):
        sys.meta_path.insert(0, TorchvisionOpSchemas())
