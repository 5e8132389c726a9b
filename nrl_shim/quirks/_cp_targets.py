"""TARGETS entries shared by the CP quirks. Stdlib only at import (quirk modules import this at start-up)."""

from ._versions import CP_MODULES


def cp_targets(quirk_id, before=None, after=None):
    """TARGETS entries of a CP quirk for the CP modules: install its hooks on torch's context_parallel (see
    _torch_cp, imported only when one of them is imported)."""

    def patch_cp(module, settings):
        from . import _torch_cp

        _torch_cp.install(module, quirk_id, before=before, after=after)

    def unpatch_cp(module):
        from . import _torch_cp

        _torch_cp.uninstall(module, quirk_id)

    return {name: (patch_cp, unpatch_cp) for name in CP_MODULES}
