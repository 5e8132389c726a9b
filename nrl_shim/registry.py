"""The quirk registry: one module per quirk, each registered in the entry-point group `nrl_shim.quirks` (nrl-shim's own
in its pyproject.toml, other packages' in theirs: one way to add a quirk; see nrl_shim/plugins.py). No quirk module
knows another.

A quirk module declares (ddtrace/OpenTelemetry style; this is the public quirk API, the same for plugins):
    ID, SUMMARY, LINK       -- stable id (used by NRL_SHIM_DISABLE; the entry point's name), one line, upstream link
    LIBRARY, VERSIONS       -- distribution name and the `packaging` specifier of the releases the fix reaches (its
                               bug exists there and what it touches is there): a lower bound; an upper bound only
                               where upstream fixed the bug (then FIXED_BY). Outside the range: see AFFECTED
    AFFECTED, NOT_AFFECTED  -- optional: the specifier of LIBRARY's releases where the bug exists, and one line saying
                               why the others lack it (e.g. "radio.py, the model file with the bug, arrives in
                               0.11.0"). Absent: the bug is taken to exist on every release. A release outside
                               VERSIONS is then either
                               - outside AFFECTED: `not-affected`, nothing to fix (no warning, strict passes; doctor
                                 says "not affected: <why>", a job's report says so once at a target's import), or
                               - in AFFECTED, where the fix cannot reach: the bug is there and unfixed. One WARNING
                                 per process at a target's import names the gap. With CASE/CASE_TARGETS, strict mode
                                 raises when that case happens, not at activation; without them strict mode stops the
                                 job at activation (no way to tell whether the job meets the bug). `doctor --strict`
                                 exits 3 naming each such gap ahead
    CASE, CASE_TARGETS      -- optional, together: the case the fix covers, in a few words ("a LoRA adapter served"),
                               and {module name: (patch, unpatch)} of hooks installed instead of the fix where the
                               release is in AFFECTED but outside VERSIONS: at the release's own entry point of that
                               case they ask registry.missing_part(ID, CASE) (the gap, recorded like a missing part,
                               below) and name it then: a warning, in strict mode the fix's error. Their names join
                               TARGETS in the index (patched only in that state)
    FIXED_BY                -- optional, with an upper bound in VERSIONS: the upstream change that fixed the bug (a PR
                               link). At or above that bound the fix is not applicable (nothing to fix: no warning)
    VERIFIED                -- optional: the releases it was verified on (tests, or the wheels' source read): a
                               specifier for LIBRARY, or {distribution: specifier} for LIBRARY and ALSO_REQUIRES' ones.
                               Absent: the bug range itself (a module without it behaves as before VERIFIED existed:
                               outside VERSIONS skipped). In VERSIONS but outside VERIFIED (a release newer than those
                               verified) the fix acts when REQUIRES/check() pass, and says so once per process, one
                               line; when they fail it is skipped with one warning naming what is missing
    REQUIRES                -- optional: what the fix touches, as "module:Attr.path" or "module:Attr.path(a, b)" (the
                               callable's first parameters after self, by name); `module` is one of TARGETS, checked
                               on that module right after it executed, before patch(), on unverified releases only
    PARTS                   -- optional {part: ("module:Attr.path", ...)}: names (REQUIRES' syntax, checked by the same
                               code) that only one part of the fix relies on, a part the fix can do without. Checked
                               on EVERY release, on each target module right after it executed, before patch(). A
                               part whose name is missing: one WARNING per process naming the fix, the part and the
                               name (never an error at start-up: the job may never meet the case); the fix still
                               acts, and asks registry.missing_part(ID, part) where the case happens, to warn then
                               (strict mode: raise its own error) or cover it another way. doctor shows it as
                               "acts, part missing"; `doctor --strict` exits 3 naming it. An optional hook is a part:
                               never a `hasattr` that skips it silently, never REQUIRES (which would withdraw the whole
                               fix on an unverified release that lacks it)
    PART_RELEASES           -- optional {part: specifier of LIBRARY}: the releases on which that part's names are
                               expected (read in the wheels, e.g. a hook vLLM added in 0.25: ">=0.25"). On the others
                               the part is not checked, nothing is said: the release has no such case
    check(module) -> str|None -- optional: further checks of a target module on unverified releases (e.g. a marker in
                               its source); returns what is missing, or None
    SETTINGS                -- optional: the NRL_* variables it reads (settings.Variable, parsed by one of the parsers
                               in nrl_shim.settings); validated and documented centrally with the core's
                               (registry.variables())
    ALSO_REQUIRES           -- optional {distribution: specifier} the fix needs as well (e.g. a transformers fix
                               that acts through torch's context_parallel)
    TARGETS                 -- {module name: (patch, unpatch)}: each target module patched once imported (before or
                               after activation) by its own functions, never one patch() branching on the name.
                               patch(module, settings) and unpatch(module) are idempotent; use nrl_shim.patching.wrap /
                               unwrap. `settings` is the active Settings, handed down by activation (quirks never
                               import activation). QuirkContract checks this form; a plugin written before it (a
                               tuple of names, the module's own patch/unpatch for all) is still read
    PRE_TARGETS             -- optional {name: before(module, settings)}: run right before that target module executes
                               (its namespace still empty; for fixes that must act before its code runs, e.g. a name
                               its imports need); `before` returns None or a callable run once the module executed,
                               whether it succeeded or not. Each name is also in TARGETS. Carried in the index.
    setup(settings)         -- optional, runs at activation (stdlib only): the one reason a quirk module is imported
                               at start-up; teardown() undoes it at deactivation
    SETUP_ARGV              -- optional, with setup(): the command-line option without which setup() has nothing to
                               do (e.g. "--config"); activation then imports the module only in processes that have it
    SETUP_DISTRIBUTION      -- optional, with setup(): the distribution name whose importlib.metadata lookup setup()
                               serves (e.g. "vllm"); an armed start-up (nrl_shim/_startup.py) defers setup() to the
                               first lookup of that name
    describe(settings, version) -> str   -- optional, one line for `nrl-shim doctor`
    idle(settings, version) -> str|None  -- optional: why the fix, though it applies, has nothing to do here

Start-up does not grow with the catalogue: for the built-in quirks activation reads nrl_shim/_quirk_index.py (per quirk:
its module, id, target module names, setup condition and SETTINGS), generated from pyproject.toml's entry points by
`python -m nrl_shim.docs` and kept in sync by a test. A quirk's module is imported when one of its targets is, or when
something else of it is needed (the version gate, doctor, docs). Plugin quirks (other distributions' entry points,
found through a cached index: nrl_shim/plugins.py) are imported at activation to read their declarations, so they
too must import only the stdlib at top level; heavy imports go inside patch().

Plugin rules (checked here, at the first use of the registry in a process): a module that fails to import or does not
declare the contract is skipped with one warning naming it and its distribution (PluginError in strict mode: a job
never breaks over a plugin otherwise); a quirk id or NRL_* variable declared twice is one PluginError naming both
distributions.
"""

import sys

TYPE_CHECKING = False  # not typing's: this module is on every interpreter's start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import ModuleType
    from typing import NoReturn

    from .settings import Settings, Variable

    Handlers = dict[str, tuple[Callable[[ModuleType, Settings], None], Callable[[ModuleType], None]]]
    # An index entry: (module name, id, target module names, setup condition, SETTINGS); see Quirk.indexed.
    Entry = tuple[str, str, tuple[str, ...], str | None, tuple[Variable, ...]]
    # A fix's release-level facts: gate() (applies, installed version, reason), then unverified() where it applies.
    Release = tuple[tuple[bool, str | None, str], str | None]

BUILTIN = "nrl-shim"  # the distribution the built-in quirks (nrl_shim/_quirk_index.py) come from


# What only the module has: read on first access, which imports it. Set one before that and it stays (tests do).
_FROM_MODULE = frozenset(
    (
        "module",
        "summary",
        "link",
        "library",
        "versions",
        "also_requires",
        "fixed_by",
        "verified",
        "requires",
        "parts",
        "part_releases",
        "affected",
        "not_affected",
        "case",
        "check",
        "setup",
        "describe",
        "idle",
        "_handlers",
        "_case_handlers",
    )
)


class Quirk:
    """A quirk module seen through the fixed interface above. Built from its index entry (Quirk.indexed: what the
    registry holds), only what the index holds is known without importing the module; the rest loads on first use.
    Quirk(module) reads a module already imported."""

    # Known from the index.
    module_name: str
    id: str
    targets: "tuple[str, ...]"
    setup_argv: "str | None"  # None: no setup(); "": setup() at every activation; else only with that option
    settings: "tuple[Variable, ...]"
    # Read from the module (see __getattr__).
    module: "ModuleType"
    summary: str
    link: str
    library: str
    versions: str
    also_requires: "dict[str, str]"
    fixed_by: "str | None"
    verified: "dict[str, str]"  # distribution -> specifier of the releases verified (LIBRARY's and ALSO_REQUIRES')
    requires: "tuple[str, ...]"
    parts: "dict[str, tuple[str, ...]]"  # part -> the names only it relies on (PARTS)
    part_releases: "dict[str, str]"  # part -> LIBRARY's releases where its names are expected (PART_RELEASES)
    affected: "str | None"  # AFFECTED: LIBRARY's releases where the bug exists (None: every release)
    not_affected: "str | None"  # NOT_AFFECTED: why releases outside AFFECTED lack the bug
    case: "str | None"  # CASE: the case the fix covers, named when it happens where the fix cannot reach
    check: "Callable[[ModuleType], str | None] | None"
    setup: "Callable[[Settings], None] | None"
    describe: "Callable[[Settings, str | None], str] | None"
    idle: "Callable[[Settings, str | None], str | None] | None"
    _handlers: "Handlers"
    _case_handlers: "Handlers"  # CASE_TARGETS

    def __init__(self, module: "ModuleType") -> None:
        setup_argv = getattr(module, "SETUP_ARGV", "") if hasattr(module, "setup") else None
        # TARGETS: a tuple of names, or {name: (patch, unpatch)} whose keys are the names; CASE_TARGETS' names join them.
        targets = tuple(dict.fromkeys((*module.TARGETS, *getattr(module, "CASE_TARGETS", {}))))
        self._declare(module.__name__, module.ID, targets, setup_argv, tuple(getattr(module, "SETTINGS", ())))
        self._load(module)

    @classmethod
    def indexed(
        cls,
        module_name: str,
        quirk_id: str,
        targets: "tuple[str, ...]",
        setup_argv: "str | None",
        settings: "tuple[Variable, ...]",
    ) -> "Quirk":
        """A quirk as its index entry declares it; its module is not imported."""
        quirk = cls.__new__(cls)
        quirk._declare(module_name, quirk_id, targets, setup_argv, settings)
        return quirk

    def _declare(
        self,
        module_name: str,
        quirk_id: str,
        targets: "tuple[str, ...]",
        setup_argv: "str | None",
        settings: "tuple[Variable, ...]",
    ) -> None:
        self.module_name, self.id, self.targets, self.setup_argv, self.settings = (
            module_name,
            quirk_id,
            targets,
            setup_argv,
            settings,
        )
        if setup_argv is None:
            self.setup = None  # known without the module

    def _load(self, module: "ModuleType") -> None:
        declared = vars(self)
        targets = module.TARGETS
        if isinstance(targets, dict):  # the contract's form: {module name: (patch, unpatch)}
            handlers = dict(targets)
        else:  # a plugin written before it: a tuple of names, all handled by the module's patch/unpatch
            handlers = {name: (module.patch, module.unpatch) for name in targets}
        for name, value in (
            ("module", module),
            ("summary", module.SUMMARY),
            ("link", module.LINK),
            ("library", module.LIBRARY),
            ("versions", module.VERSIONS),
            ("also_requires", dict(getattr(module, "ALSO_REQUIRES", {}))),
            ("fixed_by", getattr(module, "FIXED_BY", None)),
            ("verified", _verified(module)),
            ("requires", tuple(getattr(module, "REQUIRES", ()))),
            ("parts", {part: tuple(names) for part, names in dict(getattr(module, "PARTS", {})).items()}),
            ("part_releases", dict(getattr(module, "PART_RELEASES", {}))),
            ("affected", getattr(module, "AFFECTED", None)),
            ("not_affected", getattr(module, "NOT_AFFECTED", None)),
            ("case", getattr(module, "CASE", None)),
            ("check", getattr(module, "check", None)),
            ("setup", getattr(module, "setup", None)),
            ("describe", getattr(module, "describe", None)),
            ("idle", getattr(module, "idle", None)),
            ("_handlers", handlers),
            ("_case_handlers", dict(getattr(module, "CASE_TARGETS", {}))),
        ):
            declared.setdefault(name, value)

    if not TYPE_CHECKING:  # mypy checks the declared attributes above; at run time they load on first access

        def __getattr__(self, name):
            # Only called for attributes not set yet.
            if name not in _FROM_MODULE or "module" in vars(self) or "module_name" not in vars(self):
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            self._load(_import(self.module_name))
            return vars(self)[name]

    def loaded(self) -> "ModuleType | None":
        """The quirk's module if it was imported, without importing it."""
        return vars(self).get("module") or sys.modules.get(self.module_name)

    def __repr__(self) -> str:
        return f"<Quirk {self.id} from {self.module_name}>"

    def patch(self, module: "ModuleType", settings: "Settings") -> None:
        handlers = self._handlers.get(module.__name__)
        if handlers is None:
            return  # a CASE_TARGETS module only: nothing of the fix there where it reaches
        if self.parts:  # before patch(): the fix's code may ask missing_part() while patching
            _note_parts(self, module)
        handlers[0](module, settings)

    def patches(self, name: str) -> bool:
        """Whether the fix itself (TARGETS, not only CASE_TARGETS) patches module `name`."""
        return name in self._handlers

    def guard_case(self, module: "ModuleType", settings: "Settings") -> bool:
        """Where the release has the bug but is outside VERSIONS: install the CASE_TARGETS hook for `module`; whether
        it has one."""
        handlers = self._case_handlers.get(module.__name__)
        if handlers is None:
            return False
        handlers[0](module, settings)
        return True

    def unpatch(self, module: "ModuleType") -> None:
        for handlers in (self._handlers, self._case_handlers):
            if module.__name__ in handlers:
                handlers[module.__name__][1](module)

    def gate(self) -> "tuple[bool, str | None, str]":
        """(applies, installed version of LIBRARY or None, reason); None when a required library is not installed
        at all, or LIBRARY's release has the upstream fix (FIXED_BY): nothing to fix then. Imports
        importlib.metadata/packaging: call lazily."""
        fixed = self.fixed_upstream()
        if fixed:
            return False, None, fixed
        applies, installed, reason = _check(self.library, self.versions)
        if not applies and installed is not None:
            unaffected = self.unaffected(installed)
            if unaffected:
                return False, None, unaffected
            reason = self._gap(installed, reason)
        for library, versions in self.also_requires.items():
            if not applies:
                break
            applies, other, why = _check(library, versions)
            if not applies:
                return False, installed if other is not None else None, why
            reason += f"; {why}"
        return applies, installed, reason

    def _has_release(self, versions: str) -> bool:
        """Whether LIBRARY's installed release is in `versions` (an unreadable or absent one counts as in: checked)."""
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        from .libraries import find

        installed = find(self.library).version
        try:
            return installed is None or SpecifierSet(versions).contains(Version(installed), prereleases=True)
        except InvalidVersion:
            return True

    def unaffected(self, installed: "str | None" = None) -> "str | None":
        """Why there is nothing to fix when LIBRARY's installed release is outside AFFECTED and outside VERSIONS
        ("vllm 0.9.1 is outside the releases with the bug (>=0.11.0): radio.py ... arrives in 0.11.0"); else None."""
        if self.affected is None:
            return None
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        from .libraries import find

        found = find(self.library)
        installed = installed or found.version
        if installed is None:
            return None
        try:
            version = Version(installed)
        except InvalidVersion:
            return None
        if SpecifierSet(self.versions).contains(version, prereleases=True):
            return None
        if SpecifierSet(self.affected).contains(version, prereleases=True):
            return None
        why = f": {self.not_affected}" if self.not_affected else ""
        return f"not affected: {found.describe()} is outside the releases with the bug ({self.affected}){why}"

    def _gap(self, installed: str, reason: str) -> str:
        """gate()'s reason where the release has the bug (in AFFECTED, or no AFFECTED) but the fix cannot reach it."""
        from packaging.version import InvalidVersion, Version

        try:
            Version(installed)
        except InvalidVersion:
            return reason  # _check's own words: it cannot tell
        if self.affected is not None or self.case:
            from .libraries import find

            has = f" has the bug ({self.affected}) but" if self.affected is not None else ""
            reason = f"{find(self.library).describe()}{has} is outside the releases the fix reaches ({self.versions})"
        return reason

    def fixed_upstream(self) -> "str | None":
        """Why there is nothing to fix when LIBRARY's release is at or past VERSIONS' upper bound and FIXED_BY names
        the upstream fix; else None."""
        if not self.fixed_by:
            return None
        from .libraries import find

        found = find(self.library)
        bound = _above(found.version, self.versions)
        if bound is None:
            return None
        return f"{found.describe()} has the upstream fix (from {bound}: {self.fixed_by}); nothing to fix"

    def unverified(self) -> "str | None":
        """One line when a library this fix applies to is installed in a release outside VERIFIED (which release,
        which were verified); None on verified releases. Call only once gate() said the fix applies."""
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        from .libraries import find

        out = []
        for library, verified in self.verified.items():
            found = find(library)
            if found.version is None or SpecifierSet(verified).contains(Version(found.version), prereleases=True):
                continue
            newer = "newer than" if _above(found.version, verified) else "outside"
            out.append(f"{found.describe()} is {newer} the releases it was verified on ({library}{verified})")
        return "; ".join(out) or None

    def missing(self, module: "ModuleType") -> "list[str]":
        """What REQUIRES names in target `module` (and its check()) that is not there; [] when all is."""
        missing = [
            entry for entry in self.requires if entry.partition(":")[0] == module.__name__ and not _has(module, entry)
        ]
        if self.check is not None:
            try:
                found = self.check(module)
            except Exception as exc:  # a check that fails says what it could not read
                found = f"its check of {module.__name__} failed: {type(exc).__name__}: {exc}"
            if found:
                missing.append(found)
        return missing

    def missing_parts(self, module: "ModuleType") -> "dict[str, list[str]]":
        """{part: its PARTS names in target `module` that are not there}, for the parts lacking one; {} when none is.
        A part whose PART_RELEASES leave out the installed release is not checked."""
        found = {}
        for part, names in self.parts.items():
            if part in self.part_releases and not self._has_release(self.part_releases[part]):
                continue
            lacking = [name for name in names if name.partition(":")[0] == module.__name__ and not _has(module, name)]
            if lacking:
                found[part] = lacking
        return found


# --- The verdict: why a fix acts here or not. One function for activation (at each target's import), doctor, the
# contract checks and the job report (activation records the state with its lines), so they cannot disagree.

APPLIES, UNVERIFIED, PART_MISSING, IDLE = "applies", "unverified", "part-missing", "idle"  # the fix is applied
SKIPPED, OUT_OF_RANGE = "skipped", "out-of-range"  # the bug may be here and the fix does not act
NOT_INSTALLED, FIXED_UPSTREAM, NOT_AFFECTED = "not-installed", "fixed-upstream", "not-affected"  # nothing to fix
DISABLED = "disabled"  # NRL_SHIM_DISABLE
APPLIED = (APPLIES, UNVERIFIED, PART_MISSING, IDLE)  # patched (idle: with nothing to do under these settings)
ACTS = (APPLIES, UNVERIFIED, PART_MISSING)  # patched, with something to do
NOTHING_TO_FIX = (NOT_INSTALLED, FIXED_UPSTREAM, NOT_AFFECTED)
STRICT_FAILS = (OUT_OF_RANGE, SKIPPED, PART_MISSING)  # `doctor --strict` exits 3


class Verdict:
    """A fix's state here, the reason in words, the installed release, what REQUIRES names are missing (skipped on an
    unverified release), the parts lacking a name ({part: names}), its CASE, and what strict mode does about it."""

    __slots__ = ("state", "reason", "version", "missing", "parts", "case")

    def __init__(
        self,
        state: str,
        reason: str,
        version: "str | None" = None,
        missing: "tuple[str, ...]" = (),
        parts: "dict[str, list[str]] | None" = None,
        case: "str | None" = None,
    ) -> None:
        self.state, self.reason, self.version, self.missing = state, reason, version, missing
        self.parts, self.case = parts or {}, case

    @property
    def applied(self) -> bool:
        return self.state in APPLIED

    @property
    def strict(self) -> str:
        """What NRL_SHIM_STRICT=1 does about this state."""
        if self.state == OUT_OF_RANGE:
            return f"an error when {self.case} happens" if self.case else "stops the job at activation"
        if self.state == SKIPPED:
            return "an error at the target's import"
        if self.state == PART_MISSING:
            return f"an error when the case of {', '.join(self.parts)} happens"
        return "nothing"

    def __repr__(self) -> str:
        return f"<Verdict {self.state}: {self.reason}>"


def release_of(quirk: "Quirk") -> "Release":
    """gate() and unverified() of `quirk`; a declaration they cannot read (a plugin's VERSIONS or VERIFIED that is no
    specifier) is a fix that cannot tell: (False, "?", why), or an unverified release saying why. Activation keeps it
    once per process (a release does not change under a running job)."""
    try:
        gate = quirk.gate()
    except Exception as exc:
        return (False, "?", f"cannot check its versions: {type(exc).__name__}: {exc}"), None
    if not gate[0]:
        return gate, None
    try:
        return gate, quirk.unverified()
    except Exception as exc:
        return gate, f"cannot read its verified releases: {type(exc).__name__}: {exc}"


def verdict(
    quirk: "Quirk",
    settings: "Settings | None" = None,
    modules: "Mapping[str, ModuleType | BaseException] | None" = None,
    release: "Release | None" = None,
    withdrawn: "str | None" = None,
) -> "Verdict":
    """Why `quirk` acts here or not. `settings`: the user's (NRL_SHIM_DISABLE, idle()); `modules`: its target modules
    as far as they are known, each executed module or the exception its import raised (activation: those imported so
    far; doctor: import_named(quirk)); what REQUIRES and PARTS name in a module not given is not checked. `release`:
    release_of(quirk), computed here when not given; `withdrawn`: why activation withdrew the fix in this process."""
    if settings is not None and not settings.is_enabled(quirk.id):
        return Verdict(DISABLED, "listed in NRL_SHIM_DISABLE")
    (applies, version, reason), unverified = release or release_of(quirk)
    if not applies and version is None:  # not installed, upstream's fix, or a release without the bug
        if quirk.affected is not None and reason.startswith("not affected:"):
            return Verdict(NOT_AFFECTED, reason)
        return Verdict(FIXED_UPSTREAM if quirk.fixed_upstream() else NOT_INSTALLED, reason)
    if not applies:
        if version == "?":  # its declarations could not be read: it cannot tell, so it does not act
            return Verdict(SKIPPED, reason, version)
        return Verdict(OUT_OF_RANGE, reason, version, case=quirk.case)
    if withdrawn:
        return Verdict(SKIPPED, withdrawn, version)
    modules = modules or {}
    if unverified:
        missing, lacking = _missing_in(quirk, modules)
        if missing:
            return Verdict(
                SKIPPED,
                f"{unverified}, and {', '.join(lacking)} lacks what it needs: {'; '.join(missing)}",
                version,
                missing=tuple(missing),
            )
        checked = f"{len(quirk.requires)} name(s) it relies on checked" if quirk.requires else "no names declared"
        state, reason = UNVERIFIED, f"{unverified}; {checked}"
    else:
        state = APPLIES
        ranges = {quirk.library: quirk.versions, **quirk.also_requires}
        verified = [f"{lib}{spec}" for lib, spec in quirk.verified.items() if spec != ranges.get(lib)]
        if verified:
            reason += f"; verified on {', '.join(verified)}"
        idle = quirk.idle(settings, version) if settings is not None and quirk.idle else None
        if idle:
            return Verdict(IDLE, f"{reason}; nothing to do: {idle}", version)
    parts = _parts_missing_in(quirk, modules)
    if parts:
        lacking_parts = "; ".join(f"{part} not covered (missing: {', '.join(names)})" for part, names in parts.items())
        return Verdict(PART_MISSING, f"{reason}; part missing: {lacking_parts}", version, parts=parts)
    return Verdict(state, reason, version)


def _missing_in(quirk: "Quirk", modules: "Mapping[str, ModuleType | BaseException]") -> "tuple[list[str], list[str]]":
    """What REQUIRES (and check()) name that the given modules lack, and which modules lack it. A module the release
    does not ship at all, beside one that is there, is an alternative for other releases (e.g. a handler that moved to
    another module): no job imports it, so a job never checks it, and neither does this."""
    missing: list[str] = []
    lacking: list[str] = []
    named = dict.fromkeys(entry.partition(":")[0] for entry in quirk.requires)
    absent = {name for name in named if _not_shipped(name, modules.get(name))}
    for name in named:
        module = modules.get(name)
        if module is None or (name in absent and len(absent) < len(named)):
            continue
        found = (
            [f"module {name} ({type(module).__name__}: {module})"]
            if isinstance(module, BaseException)
            else quirk.missing(module)
        )
        if found:
            missing.extend(found)
            lacking.append(name)
    if quirk.check is not None:  # check() reads target modules REQUIRES may not name
        for name, module in modules.items():
            # the modules the fix itself patches (a CASE_TARGETS-only one is for releases it does not reach)
            if name not in lacking and not isinstance(module, BaseException) and quirk.patches(name):
                found = [m for m in quirk.missing(module) if m not in missing]
                if found:
                    missing.extend(found)
                    lacking.append(name)
    return missing, lacking


def _not_shipped(name: str, module: "ModuleType | BaseException | None") -> bool:
    """Whether importing `name` failed because the release has no such module (not: it is there and broke)."""
    absent = getattr(module, "name", None) if isinstance(module, ModuleNotFoundError) else None
    return bool(absent) and (name == absent or name.startswith(f"{absent}."))


def _parts_missing_in(quirk: "Quirk", modules: "Mapping[str, ModuleType | BaseException]") -> "dict[str, list[str]]":
    """{part: names lacking} in the given modules. A module the release does not ship at all is one no job imports,
    so a job never names it either: not a missing part (e.g. vllm-layerwise-refit's reload hooks before vLLM's
    layerwise reload); one that fails to import is (its parts' names are gone with it)."""
    found: dict[str, list[str]] = {}
    for name in dict.fromkeys(n.partition(":")[0] for names in quirk.parts.values() for n in names):
        module = modules.get(name)
        if module is None:
            continue
        if isinstance(module, BaseException):
            if _not_shipped(name, module):
                continue
            gone = f"module {name} ({type(module).__name__}: {module})"
            for part, declared in quirk.parts.items():
                if part in quirk.part_releases and not quirk._has_release(quirk.part_releases[part]):
                    continue
                if any(n.partition(":")[0] == name for n in declared):
                    found.setdefault(part, []).append(gone)
            continue
        for part, lacking in quirk.missing_parts(module).items():
            found.setdefault(part, []).extend(lacking)
    return found


def import_named(quirk: "Quirk") -> "dict[str, ModuleType | BaseException]":
    """Every module REQUIRES and PARTS name, imported here (doctor's way to check them ahead; a job checks each when
    it is imported), or the exception its import raised."""
    import importlib

    found: dict[str, ModuleType | BaseException] = {}
    names = (*quirk.requires, *(n for names in quirk.parts.values() for n in names))
    for name in dict.fromkeys(entry.partition(":")[0] for entry in names):
        try:
            found[name] = importlib.import_module(name)
        except Exception as exc:  # gone or broken on this release: the verdict says what that means
            found[name] = exc
    return found


# (quirk id, part) -> the names that part lacks on this release, as found at its target modules' import.
_MISSING_PARTS: "dict[tuple[str, str], list[str]]" = {}


def _note_parts(quirk: "Quirk", module: "ModuleType") -> None:
    """Check a target module for the quirk's PARTS: each part lacking a name is recorded (missing_part) and named in
    one WARNING per process."""
    try:
        lacking = quirk.missing_parts(module)
    except Exception as exc:  # a check that fails says what it could not read, and the part counts as missing
        lacking = {
            part: [f"its check of {module.__name__} failed: {type(exc).__name__}: {exc}"] for part in quirk.parts
        }
    if not lacking:
        return
    from . import report

    for part, names in lacking.items():
        known = _MISSING_PARTS.setdefault((quirk.id, part), [])
        known.extend(name for name in names if name not in known)
        report.warn_once(
            quirk.id,
            f"part {part}: {', '.join(names)}",
            f"[{quirk.id}] acts, but not for {part} on this release: {module.__name__} lacks {', '.join(names)}; "
            f"when that case happens it is named then (an error in strict mode)",
        )


def note_gap(quirk: "Quirk", reason: str) -> None:
    """A fix whose release has the bug but which cannot reach it, with a CASE: recorded as its part CASE missing
    (missing_part(ID, CASE) says `reason` where the case happens) and named in one WARNING per process."""
    assert quirk.case is not None
    known = _MISSING_PARTS.setdefault((quirk.id, quirk.case), [])
    if reason not in known:
        known.append(reason)
    from . import report

    report.warn_once(
        quirk.id,
        "gap",
        f"[{quirk.id}] fix skipped: {reason}; {quirk.case} is named when it happens (strict mode: an error then)",
        kind="skipped",
        state=OUT_OF_RANGE,
    )


def missing_part(quirk_id: str, part: str) -> "str | None":
    """What part `part` (a key of its PARTS) of fix `quirk_id` lacks on this release, e.g.
    "vllm.model_executor.model_loader.reload.layerwise:_layerwise_process", as found when its target modules were
    imported; None when nothing is (or none of them was imported yet). For the fix's own code where the case happens.
    For part CASE of a fix whose release has the bug but is outside VERSIONS (note_gap): why the fix does not reach."""
    names = _MISSING_PARTS.get((quirk_id, part))
    return ", ".join(names) if names else None


def _verified(module: "ModuleType") -> "dict[str, str]":
    ranges = {module.LIBRARY: module.VERSIONS, **dict(getattr(module, "ALSO_REQUIRES", {}))}
    verified = getattr(module, "VERIFIED", None)
    if verified is None:
        return ranges  # verified where it applies: no release is unverified (outside VERSIONS it is skipped)
    if isinstance(verified, str):
        verified = {module.LIBRARY: verified}
    return {**ranges, **dict(verified)}


def _above(installed: "str | None", versions: str) -> "str | None":
    """The upper bound of `versions` that `installed` is at or past (`<X`/`<=X`), or None."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    if installed is None:
        return None
    try:
        version = Version(installed)
    except InvalidVersion:
        return None
    for spec in SpecifierSet(versions):
        bound = Version(spec.version.rstrip(".*"))
        if (spec.operator == "<" and version >= bound) or (spec.operator == "<=" and version > bound):
            return spec.version
    return None


def _has(module: "ModuleType", entry: str) -> bool:
    """Whether REQUIRES entry "module:Attr.path" or "module:Attr.path(a, b)" holds in `module`."""
    path, _, params = entry.partition(":")[2].partition("(")
    target: object = module
    for part in path.split("."):
        if not hasattr(target, part):
            return False
        target = getattr(target, part)
    if not params:
        return True
    import inspect

    wanted = [name.strip() for name in params.rstrip(")").split(",") if name.strip()]
    if not callable(target):
        return False
    try:
        names = [p for p in inspect.signature(target).parameters if p not in ("self", "cls")]
    except (TypeError, ValueError):
        return False
    return names[: len(wanted)] == wanted


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


# The index's entries, read without building Quirk objects where activation needs only ids, targets or settings:
# per-quirk Python work at start-up is what would grow with the catalogue. Built-ins first, then plugins.
_ENTRIES: "tuple[Entry, ...] | None" = None
_BY_ID: "dict[str, Quirk]" = {}  # built on first need, one per quirk: a value set on it (tests do) stays
_QUIRKS: "tuple[Quirk, ...] | None" = None
_ORIGIN: "dict[str, str]" = {}  # quirk id -> the distribution that declared it (plugins only; built-ins: BUILTIN)


def _entries() -> "tuple[Entry, ...]":
    global _ENTRIES
    if _ENTRIES is None:
        from ._quirk_index import QUIRKS

        builtin: tuple[Entry, ...] = QUIRKS
        _ENTRIES = builtin + _plugin_entries(builtin)
    return _ENTRIES


def __getattr__(name: str) -> "tuple[str, ...]":
    # QUIRK_MODULES: the built-in quirk modules in registration order (pyproject.toml's entry points, via the index).
    if name == "QUIRK_MODULES":
        from ._quirk_index import QUIRKS

        return tuple(entry[0] for entry in QUIRKS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def origin(quirk_id: str) -> str:
    """The distribution that declared quirk `quirk_id` (BUILTIN for nrl-shim's own; NRL_SHIM_PLUGINS for a module
    listed there)."""
    _entries()
    return _ORIGIN.get(quirk_id, BUILTIN)


def _plugin_entries(builtin: "tuple[Entry, ...]") -> "tuple[Entry, ...]":
    """Index entries of the plugin quirks: each declared module imported (stdlib only at top level, by contract) and
    read as the built-ins' are. Import or declaration problems skip that plugin; clashes are errors."""
    from . import plugins

    declared = plugins.declared()
    if not declared:
        return ()
    from .settings import SHARED_VARIABLES

    ids = {entry[1]: (BUILTIN, entry[0]) for entry in builtin}
    modules = {module for _, module in ids.values()}
    names = {v.name: (BUILTIN, v.name) for v in SHARED_VARIABLES}
    attrs = {v.attr: (BUILTIN, v.name) for v in SHARED_VARIABLES}
    for entry in builtin:
        names.update({v.name: (BUILTIN, entry[1]) for v in entry[4]})
        attrs.update({v.attr: (BUILTIN, entry[1]) for v in entry[4]})
    found: list[Entry] = []
    for dist, ep_name, module_name in declared:
        if module_name in modules:
            continue  # one module declared twice (nrl-shim's own entry points, or an entry point and NRL_SHIM_PLUGINS)
        try:
            module = _import(module_name)
            plugins.record(module, ep_name)  # the contract's checks: one rule with the records start-up reads
            quirk = Quirk(module)
        except Exception as exc:  # never a broken job over someone else's quirk: skip it, say so once
            _plugin_failed(dist, module_name, f"{type(exc).__name__}: {exc}")
            continue
        modules.add(module_name)
        clash = ids.get(quirk.id)
        if clash:
            _clash(f"quirk id {quirk.id!r}", clash, (dist, module_name))
        for variable in quirk.settings:
            for key, seen in ((variable.name, names), (variable.attr, attrs)):
                if key in seen:
                    _clash(f"setting {variable.name!r} (attribute {variable.attr!r})", seen[key], (dist, quirk.id))
            names[variable.name] = attrs[variable.attr] = (dist, quirk.id)
        ids[quirk.id] = (dist, module_name)
        _ORIGIN[quirk.id] = dist
        _BY_ID.setdefault(quirk.id, quirk)  # its module is loaded: this object already has everything
        found.append(_entry(quirk))
    return tuple(found)


def _clash(what: str, first: "tuple[str, str]", second: "tuple[str, str]") -> "NoReturn":
    from .errors import PluginError

    raise PluginError(
        f"{what} is declared twice: by the distribution {first[0]!r} ({first[1]}) and by {second[0]!r} ({second[1]}) "
        f"(entry-point group `nrl_shim.quirks`); uninstall one of them, or rename the quirk in the plugin"
    )


def _plugin_failed(dist: str, module_name: str, why: str) -> None:
    import os

    from .settings import parse_bool

    message = f"plugin quirk {module_name!r} from the distribution {dist!r} skipped: {why}"
    try:  # settings are not parsed yet (they need the plugins' SETTINGS): read strictness directly
        strict = bool(parse_bool("NRL_SHIM_STRICT", os.environ.get("NRL_SHIM_STRICT", "0")))
    except Exception:
        strict = False  # a bad value is reported by load_settings right after
    if strict:
        from .errors import PluginError

        raise PluginError(f"{message} (NRL_SHIM_STRICT=1; uninstall it or fix it to go on)")
    from . import report

    report.warn_once("plugins", module_name, message)


def _entry(quirk: "Quirk") -> "Entry":
    return quirk.module_name, quirk.id, quirk.targets, quirk.setup_argv, quirk.settings


def _quirk(entry: "Entry") -> "Quirk":
    quirk = _BY_ID.get(entry[1])
    if quirk is None:
        quirk = _BY_ID.setdefault(entry[1], Quirk.indexed(*entry))  # setdefault: one object even if threads race
    return quirk


def quirks() -> "tuple[Quirk, ...]":
    """All registered quirks, in registry order. No quirk module is imported here."""
    global _QUIRKS
    if _QUIRKS is None:
        _QUIRKS = tuple(_quirk(entry) for entry in _entries())
    return _QUIRKS


def targets(settings: "Settings") -> "frozenset[str]":
    """The module names the quirks enabled in `settings` patch."""
    return frozenset(name for entry in _entries() if settings.is_enabled(entry[1]) for name in entry[2])


def with_setup(settings: "Settings") -> "list[Quirk]":
    """The quirks enabled in `settings` whose setup() has something to do in this process (activation runs them)."""
    argv = getattr(sys, "argv", None) or ()
    return [
        _quirk(entry)
        for entry in _entries()
        if entry[3] is not None
        and (not entry[3] or any(arg == entry[3] or arg.startswith(entry[3] + "=") for arg in argv))
        and settings.is_enabled(entry[1])
    ]


def _import(name: str) -> "ModuleType":
    __import__(name)  # plain __import__: `importlib` itself is not loaded at interpreter start-up
    return sys.modules[name]


_PRE_ENTRIES: "tuple[tuple[str, str], ...] | None" = None


def _pre_entries() -> "tuple[tuple[str, str], ...]":
    """(target module name, quirk id) per PRE_TARGETS entry: the built-ins' from the index, plugins' from their modules
    (imported already: that is how the registry reads a plugin)."""
    global _PRE_ENTRIES
    if _PRE_ENTRIES is None:
        from . import _quirk_index

        entries: tuple[tuple[str, str], ...] = tuple(getattr(_quirk_index, "PRE_TARGETS", ()))
        builtin = {entry[1] for entry in _quirk_index.QUIRKS}
        for entry in _entries():
            if entry[1] not in builtin:
                module = _import(entry[0])
                entries += tuple((name, module.ID) for name in getattr(module, "PRE_TARGETS", {}))
        _PRE_ENTRIES = entries
    return _PRE_ENTRIES


def pre_targets(settings: "Settings") -> "frozenset[str]":
    """The module names with a PRE_TARGETS hook of a quirk enabled in `settings`."""
    return frozenset(name for name, quirk_id in _pre_entries() if settings.is_enabled(quirk_id))


def pre_quirks(name: str, settings: "Settings") -> "list[Quirk]":
    """The enabled quirks with a PRE_TARGETS hook for module `name`, in registry order."""
    return [get(quirk_id) for target, quirk_id in _pre_entries() if target == name and settings.is_enabled(quirk_id)]


def quirk_ids() -> "tuple[str, ...]":
    return tuple(entry[1] for entry in _entries())


def variables() -> "tuple[Variable, ...]":
    """Every NRL_* variable: the core's, then each quirk's own SETTINGS, in registry order."""
    from .settings import SHARED_VARIABLES

    declared = list(SHARED_VARIABLES)
    for entry in _entries():
        declared.extend(entry[4])
    return tuple(declared)


def load_settings(environ: "Mapping[str, str] | None" = None) -> "Settings":
    """Settings from `environ` (default os.environ): every declared variable parsed and validated."""
    from .settings import Settings

    return Settings.from_env(environ, known_ids=quirk_ids(), variables=variables())


def get(quirk_id: str) -> "Quirk":
    for entry in _entries():
        if entry[1] == quirk_id:
            return _quirk(entry)
    raise KeyError(quirk_id)
