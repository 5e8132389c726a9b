"""Where quirks come from: the entry-point group `nrl_shim.quirks`, found without scanning at every start-up.

A package adds a quirk the way nrl-shim adds its own: a module that declares the quirk contract (see registry), and
one line in its pyproject.toml:

    [project.entry-points."nrl_shim.quirks"]
    my-quirk-id = "my_package.my_quirk"      # name = the module's ID; value = the module (no `:attr`)

nrl-shim's own pyproject declares its built-in quirks in the same group; for those, nrl_shim/_quirk_index.py (generated
from that table by `python -m nrl_shim.docs`) is what the registry reads, so the core's start-up reads no metadata.

Discovery without the cost. `importlib.metadata` costs ~50 ms to import and a scan of every installed distribution
~7-16 ms in a venv with vLLM's ~160 (measured in the vllm_cpu venv): most of the shim's start-up budget, in every
interpreter. So a scan's result is cached on disk, keyed by the sys.path entries it scanned and stamped with each
entry's mtime. Installing or removing a distribution adds or removes a `*.dist-info` directory (or a `.pth`) in a site
directory, which changes that directory's mtime; the next interpreter start sees a different stamp and scans again.
What it costs when nothing changed: one os.stat per sys.path entry and one small file read (marshal, a builtin).
Not watched: the script's own directory and the current directory (`''`), which programs write to all the time; a
distribution installed there is not found. Plugin packages reach Ray workers with their own Python the way the shim
does (ray-propagate-env ships them with py_modules and lists their modules in NRL_SHIM_PLUGINS).

The index also holds the plan of an armed start-up (nrl_shim/_startup.py: which modules and metadata lookups to
watch, which variables and options make it activate at once), computed at the scan from each quirk's record(): the
built-ins' from nrl_shim/_quirk_index.py, the plugins' read by importing their modules then. It is stamped with those
files' mtimes too: an edited plugin (an editable install) or catalogue (a checkout) is scanned again. So an unchanged
environment starts without importing any plugin, the quirk index or the settings.

Stdlib only (os, sys, marshal): this module is on every interpreter's start-up path.
"""

import marshal
import os
import sys

TYPE_CHECKING = False  # not typing's: start-up path
if TYPE_CHECKING:
    from types import ModuleType

    # (distribution name, entry-point name or None, module name)
    Plugin = tuple[str, str | None, str]
    # What start-up needs of a quirk module (see record()): (module, id, target modules, setup condition, the
    # distribution whose metadata lookup setup() waits for, its variables' names, their Settings attributes).
    Record = tuple[str, str, tuple[str, ...], str | None, str | None, tuple[str, ...], tuple[str, ...]]
    # What an armed start-up needs (nrl_shim/_startup.py): the target modules to watch, the distribution names whose
    # metadata lookup a setup() waits for, the variables whose being set means settings to validate at once, and the
    # command-line options with which a setup() has work at once.
    Plan = tuple[frozenset[str], frozenset[str], tuple[str, ...], tuple[str, ...]]

GROUP = "nrl_shim.quirks"
# Quirk modules to load beside the entry points, comma separated: how Ray workers with their own Python (no dist-info
# of the plugin there) learn which shipped modules are quirks. Users may set it too (a quirk module not packaged yet).
ENV = "NRL_SHIM_PLUGINS"
ENV_SOURCE = ENV  # what stands for the distribution in messages about a module listed there
_FORMAT = 3  # bump when the cached tuple changes shape


def declared() -> "tuple[Plugin, ...]":
    """Every quirk module other packages declare: the entry points of GROUP (cached, see above), then NRL_SHIM_PLUGINS."""
    found = discovered()
    extra = tuple((ENV_SOURCE, None, m.strip()) for m in os.environ.get(ENV, "").split(",") if m.strip())
    return found + extra


def discovered() -> "tuple[Plugin, ...]":
    """The entry points of GROUP in the watched sys.path entries, from the cache when its stamp still matches."""
    paths = watched_paths()
    cached = _read(paths)
    if cached is not None:
        return cached[0]
    stamp = _stamp(paths)  # before the scan: an install while it runs is seen at the next start
    found, plan, files = _index(paths)
    _write(cache_file(paths), (_FORMAT, paths, stamp, found, plan, files, _stamp(files)))
    return found


def start_up_plan() -> "Plan | None":
    """What an armed start-up needs, from the cache; None when the cache is missing or stale (no scan here: start-up
    then activates at once, which scans) or when start-up must activate at once anyway (see _plan)."""
    cached = _read(watched_paths())
    return None if cached is None else cached[1]


def _read(paths: "tuple[str, ...]") -> "tuple[tuple[Plugin, ...], Plan | None] | None":
    try:
        # os.open/os.read rather than open(): no io objects, no isatty/fstat calls; the file is a few hundred bytes.
        fd = os.open(cache_file(paths), os.O_RDONLY)
        try:
            data = os.read(fd, 1 << 20)
        finally:
            os.close(fd)
        fmt, cached_paths, stamp, found, plan, files, file_stamp = marshal.loads(data)
        if fmt == _FORMAT and cached_paths == paths and stamp == _stamp(paths) and file_stamp == _stamp(files):
            return found, plan
    except Exception:  # no cache yet, unreadable, another Python's marshal format or another shape, torn: stale
        pass
    return None


def _stamp(paths: "tuple[str, ...]") -> "tuple[int, ...]":
    return tuple(_mtime(p) for p in paths)


def watched_paths() -> "tuple[str, ...]":
    skip = {""}
    try:
        skip.add(os.getcwd())
    except OSError:
        pass
    argv0 = (getattr(sys, "argv", None) or [""])[0]
    if argv0 and argv0 not in ("-c", "-m"):
        skip.add(os.path.dirname(os.path.abspath(argv0)))  # the script's directory (sys.path[0] once it runs)
    return tuple(p for p in sys.path if isinstance(p, str) and p not in skip)


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1  # absent (python311.zip ...): appearing later changes the stamp too


def cache_dir() -> str:
    explicit = os.environ.get("NRL_SHIM_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nrl-shim")


def cache_file(paths: "tuple[str, ...]") -> str:
    # hashlib/zlib are not worth importing here and str hashes differ per process; a tuple of ints hashes the same in
    # every process of one Python (the cache_tag in the name keeps Pythons apart), computed in C.
    key = hash(tuple("\0".join(paths).encode("utf-8", "surrogateescape"))) & 0xFFFFFFFFFFFFFFFF
    return os.path.join(cache_dir(), f"plugins-{sys.implementation.cache_tag}-{key:016x}.marshal")


def scan(paths: "tuple[str, ...]") -> "tuple[Plugin, ...]":
    """The entry points of GROUP in the distributions on `paths` (first one of a name wins, as importlib's own)."""
    from importlib.metadata import distributions

    found: list[Plugin] = []
    seen: set[str] = set()
    for dist in distributions(path=list(paths)):
        key = getattr(dist, "_normalized_name", None) or str(dist.metadata["Name"])
        if key in seen:
            continue
        seen.add(key)
        text = dist.read_text("entry_points.txt")
        if not text or GROUP not in text:  # most distributions: no need to parse
            continue
        for ep in dist.entry_points:
            if ep.group == GROUP:
                found.append((str(dist.metadata["Name"] or key), ep.name, ep.value.partition(":")[0].strip()))
    return tuple(found)


def _index(paths: "tuple[str, ...]") -> "tuple[tuple[Plugin, ...], Plan | None, tuple[str, ...]]":
    """Scan `paths`; import each plugin module found (not nrl-shim's own) to read its record; the start-up plan from
    the built-ins' records and theirs; the files they come from (stamped: an edit is seen at the next start)."""
    from . import _quirk_index
    from .settings import SHARED_VARIABLES

    found = scan(paths)
    deferred = dict(_quirk_index.SETUP_DISTRIBUTIONS)
    # The built-ins' records, as record() reads a module, from the quirk index (no quirk module imported).
    records: list[Record | None] = [
        (module, quirk_id, targets, setup_argv, deferred.get(quirk_id), tuple(v.name for v in variables),
         tuple(v.attr for v in variables))
        for module, quirk_id, targets, setup_argv, variables in _quirk_index.QUIRKS
    ]  # fmt: skip
    builtin = {entry[0] for entry in _quirk_index.QUIRKS}
    files = [_quirk_index.__file__]  # the catalogue itself (a checkout on PYTHONPATH changes without an install)
    for _dist, ep_name, module_name in found:
        if module_name in builtin:
            continue
        try:
            __import__(module_name)
            module = sys.modules[module_name]
            records.append(record(module, ep_name))
            if getattr(module, "__file__", None):
                files.append(module.__file__)  # type: ignore[arg-type]
        except Exception:  # activation imports it again and says why, once
            records.append(None)
    core = (tuple(v.name for v in SHARED_VARIABLES), tuple(v.attr for v in SHARED_VARIABLES))
    return found, _plan(core, records), tuple(files)


def _plan(core: "tuple[tuple[str, ...], tuple[str, ...]]", records: "list[Record | None]") -> "Plan | None":
    """The start-up plan for the quirks of `records`, or None where start-up must activate at once in every process:
    a plugin that failed at the scan or clashes (activation says so), a setup() with work in every process."""
    names, attrs = set(core[0]), set(core[1])
    ids: set[str] = set()
    modules: set[str] = set()
    distributions: set[str] = set()
    options: list[str] = []
    for entry in records:
        if entry is None:
            return None
        _module, quirk_id, targets, setup_argv, setup_distribution, variables, attributes = entry
        if quirk_id in ids or names.intersection(variables) or attrs.intersection(attributes):
            return None
        ids.add(quirk_id)
        names.update(variables)
        attrs.update(attributes)
        modules.update(targets)
        if setup_argv is not None:
            if setup_distribution:
                distributions.add(setup_distribution.lower())
            elif setup_argv:
                options.append(setup_argv)
            else:
                return None
    names.discard("NRL_SHIM")
    return frozenset(modules), frozenset(distributions), (*sorted(names), ENV), tuple(options)


def record(module: "ModuleType", ep_name: "str | None" = None) -> "Record":
    """What start-up needs of a quirk module, once it passes the contract checks every plugin must pass (a ValueError
    or AttributeError names what is wrong). One rule for the built-ins (the quirk index holds the same), the plugins'
    cached records and the registry's checks."""
    quirk_id = module.ID
    if ep_name is not None and ep_name != quirk_id:
        raise ValueError(f"the entry point is named {ep_name!r} but the module's ID is {quirk_id!r}")
    if not (isinstance(quirk_id, str) and module.LIBRARY and module.VERSIONS and module.LINK):
        raise ValueError("ID, LIBRARY, VERSIONS and LINK must all be set")
    # TARGETS: a tuple of names, or {name: (patch, unpatch)}; CASE_TARGETS' names are watched too (registry.py)
    case_targets = dict(getattr(module, "CASE_TARGETS", {}))
    if bool(case_targets) != bool(getattr(module, "CASE", None)):
        raise ValueError("CASE and CASE_TARGETS go together: the case named, and the hooks that name it")
    targets = tuple(dict.fromkeys((*module.TARGETS, *case_targets)))
    has_setup = hasattr(module, "setup")
    if not (targets or has_setup):
        raise ValueError("neither TARGETS nor setup(): it would do nothing")
    variables = tuple(getattr(module, "SETTINGS", ()))
    return (
        module.__name__,
        quirk_id,
        targets,
        getattr(module, "SETUP_ARGV", "") if has_setup else None,
        getattr(module, "SETUP_DISTRIBUTION", None) if has_setup else None,
        tuple(v[0] for v in variables),
        tuple(v[1] for v in variables),
    )


def _write(path: str, data: "tuple") -> None:
    # Atomic (write aside, then rename): processes starting together may all scan; the last rename wins, all equal.
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            marshal.dump(data, f)
        os.replace(tmp, path)
        _prune(os.path.dirname(path))
    except OSError:
        pass  # a read-only home: correct, only slower (a scan at each start); NRL_SHIM_CACHE_DIR points elsewhere


_KEEP = 64  # index files kept: one per distinct sys.path (each Ray job's workers have their own unpacked py_modules)


def _prune(directory: str) -> None:
    """Drop the least recently written index files beyond _KEEP (this runs only after a scan)."""
    try:
        files = [os.path.join(directory, n) for n in os.listdir(directory) if n.startswith("plugins-")]
        if len(files) > _KEEP:
            for old in sorted(files, key=_mtime)[: len(files) - _KEEP]:
                os.remove(old)
    except OSError:
        pass  # another process pruned the same file first
