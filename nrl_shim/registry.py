"""The quirk registry: one module per quirk under nrl_shim/quirks, listed here. No quirk module knows another.

A quirk module declares (ddtrace/OpenTelemetry style):
    ID, SUMMARY, LINK       -- stable id (used by NRL_SHIM_DISABLE), one line, upstream link
    LIBRARY, VERSIONS       -- distribution name and the `packaging` specifier of the releases it applies to
    SETTINGS                -- optional: the NRL_* variables it reads (settings.Variable); validated and documented
                               centrally with the core's (registry.variables())
    ALSO_REQUIRES           -- optional {distribution: specifier} the fix needs as well (e.g. a transformers fix
                               that acts through torch's context_parallel)
    TARGETS                 -- module names, each patched once imported (before or after activation): a tuple (the
                               module's patch/unpatch handle all of them) or {name: (patch, unpatch)} per target
    patch(module, settings), unpatch(module) -- idempotent; use nrl_shim.patching.wrap / unwrap. `settings` is the
                               active Settings, handed down by activation (quirks never import activation)
    setup(settings)         -- optional, runs at activation in every process (stdlib only: it is on the start-up path)
    describe(settings, version) -> str   -- optional, one line for `nrl-shim doctor`
    idle(settings, version) -> str|None  -- optional: why the fix, though it applies, has nothing to do here
Quirk modules import only the stdlib at top level, so listing them costs nothing; heavy imports go inside patch().
"""

import sys

TYPE_CHECKING = False  # not typing's: this module is on every interpreter's start-up path
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import ModuleType

    from .settings import Settings, Variable

QUIRK_MODULES = (
    "nrl_shim.quirks.vllm_gemma_load_format",
    "nrl_shim.quirks.vllm_v1_runtime",
    "nrl_shim.quirks.vllm_eager_recipes",
    "nrl_shim.quirks.vllm_async_timeout",
    "nrl_shim.quirks.vllm_refit_guard",
    "nrl_shim.quirks.cp_attention_mask",
    "nrl_shim.quirks.cp_gemma3",
    "nrl_shim.quirks.cp_flash_attention",
    "nrl_shim.quirks.cp_sequence_parallel",
    "nrl_shim.quirks.ray_propagate_env",
)


class Quirk:
    """A quirk module seen through the fixed interface above."""

    def __init__(self, module: "ModuleType") -> None:
        self.module = module
        self.id = module.ID
        self.summary = module.SUMMARY
        self.link = module.LINK
        self.library = module.LIBRARY
        self.versions = module.VERSIONS
        self.also_requires = dict(getattr(module, "ALSO_REQUIRES", {}))
        targets = module.TARGETS
        if isinstance(targets, dict):  # {module name: (patch, unpatch)}: each target its own functions
            self._handlers = dict(targets)
        else:  # a tuple of module names, all handled by the module's patch/unpatch
            self._handlers = {name: (module.patch, module.unpatch) for name in targets}
        self.targets = tuple(self._handlers)
        self.setup = getattr(module, "setup", None)
        self.describe = getattr(module, "describe", None)
        self.idle = getattr(module, "idle", None)
        self.settings = tuple(getattr(module, "SETTINGS", ()))

    def __repr__(self) -> str:
        return f"<Quirk {self.id} {self.library}{self.versions}>"

    def patch(self, module: "ModuleType", settings: "Settings") -> None:
        self._handlers[module.__name__][0](module, settings)

    def unpatch(self, module: "ModuleType") -> None:
        self._handlers[module.__name__][1](module)

    def gate(self) -> "tuple[bool, str | None, str]":
        """(applies, installed version of LIBRARY or None, reason); None when a required library is not installed
        at all (nothing to fix then). Imports importlib.metadata/packaging: call lazily."""
        applies, installed, reason = _check(self.library, self.versions)
        for library, versions in self.also_requires.items():
            if not applies:
                break
            applies, other, why = _check(library, versions)
            if not applies:
                return False, installed if other is not None else None, why
            reason += f"; {why}"
        return applies, installed, reason


def _check(library: str, versions: str) -> "tuple[bool, str | None, str]":
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    from .libraries import find

    found = find(library)
    installed = found.version
    if installed is None:
        return False, None, f"{library} is not installed (no distribution provides the `{library}` package)"
    label = found.describe()
    try:
        ok = SpecifierSet(versions).contains(Version(installed), prereleases=True)
    except InvalidVersion:
        return False, installed, f"{label}: {installed!r} is not a valid version; cannot tell if the fix applies"
    if not ok:
        return False, installed, f"{label} is outside the supported range {versions}"
    return True, installed, f"{label} is in {versions}"


_QUIRKS = None


def quirks() -> "tuple[Quirk, ...]":
    """All registered quirks, in registry order (imported once)."""
    global _QUIRKS
    if _QUIRKS is None:
        _QUIRKS = tuple(Quirk(_import(name)) for name in QUIRK_MODULES)
    return _QUIRKS


def _import(name: str) -> "ModuleType":
    __import__(name)  # plain __import__: `importlib` itself is not loaded at interpreter start-up
    return sys.modules[name]


def quirk_ids() -> "tuple[str, ...]":
    return tuple(q.id for q in quirks())


def variables() -> "tuple[Variable, ...]":
    """Every NRL_* variable: the core's, then each quirk's own SETTINGS, in registry order."""
    from .settings import CORE_VARIABLES

    declared = list(CORE_VARIABLES)
    for quirk in quirks():
        declared.extend(quirk.settings)
    return tuple(declared)


def load_settings(environ: "Mapping[str, str] | None" = None) -> "Settings":
    """Settings from `environ` (default os.environ): every declared variable parsed and validated."""
    from .settings import Settings

    return Settings.from_env(environ, known_ids=quirk_ids(), variables=variables())


def get(quirk_id: str) -> "Quirk":
    for quirk in quirks():
        if quirk.id == quirk_id:
            return quirk
    raise KeyError(quirk_id)
