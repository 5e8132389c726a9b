"""vllm-dist-alias's lookup (see that module): imported at the first lookup by name of `vllm`, not at start-up. It
gets the quirk's declarations and state as arguments (no import back: dependencies point one way)."""

import sys


def _others_find(finder, context):
    """Whether another finder knows a distribution named like the context asks (a real or copied `vllm`)."""
    for other in sys.meta_path:
        find = getattr(other, "find_distributions", None)
        if other is finder or isinstance(other, type(finder)) or find is None:
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


def _provider(state):
    """(distribution, alias version) for the distribution that provides the importable `vllm` package, or ("", why)."""
    if state.answer is None:
        from nrl_shim.libraries import find

        found = find("vllm")
        if found.version is None or found.distribution is None:
            state.answer = ("", "no distribution provides an importable `vllm` package")
        elif found.distribution.lower() == "vllm":
            state.answer = ("", "a distribution named vllm provides it")
        else:
            state.answer = (found.distribution, alias_version(found.distribution, found.version), found)
    return state.answer


def answer(finder, context, state, quirk_id, link, versions, verified=None):
    """The alias for a lookup by name of `vllm` (a list of one distribution), or [] (see vllm_dist_alias)."""
    from nrl_shim import report

    if _others_find(finder, context):
        report.unchanged(quirk_id, "importlib.metadata `vllm`", "a distribution named vllm is installed")
        return []
    provider = _provider(state)
    if not provider[0]:
        return []
    distribution, version, found = provider
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        applies = SpecifierSet(versions).contains(Version(found.version), prereleases=True)
    except InvalidVersion:
        applies = False
    if not applies:
        message = f"[{quirk_id}] fix skipped: {found.describe()} is outside the supported range {versions}"
        if state.settings is not None and state.settings.strict:
            from nrl_shim.errors import QuirkSkippedError

            raise QuirkSkippedError(
                f"{message} (NRL_SHIM_STRICT=1; to go on without it set NRL_SHIM_DISABLE={quirk_id})"
            )
        report.warn_once(quirk_id, "range", message)
        return []
    if verified is not None and not SpecifierSet(verified).contains(Version(found.version), prereleases=True):
        report.warn_once(
            quirk_id,
            "unverified",
            f"[{quirk_id}] acts on an unverified release: {found.describe()} is newer than the releases it was "
            f"verified on (vllm{verified}); no names declared to check",
        )
    from importlib.metadata import Distribution

    real = next(iter(Distribution.discover(name=distribution, path=list(getattr(context, "path", sys.path)))), None)
    if real is None:
        return []  # not in the paths this lookup searches
    report.changed(
        quirk_id,
        "importlib.metadata `vllm`",
        "PackageNotFoundError",
        f"distribution {distribution} as version {version}",
        f"vLLM is installed as {distribution}; vLLM's CLI and verl ask for `vllm`; {link}",
    )
    return [_alias_class(state, quirk_id)(real, version)]


def _alias_class(state, quirk_id):
    if state.alias_class is None:
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
                return f"<{self.real.metadata['Name']} {self.alias_version} answering for vllm (nrl_shim {quirk_id})>"

        state.alias_class = VllmAlias
    return state.alias_class


def _with_version(text, version):
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            break  # end of the headers
        if line.lower().startswith("version:"):
            lines[i] = f"Version: {version}"
            break
    return "\n".join(lines)


def idle_reason():
    from nrl_shim.libraries import find

    found = find("vllm")
    if found.distribution is not None and found.distribution.lower() == "vllm":
        return "a distribution named vllm provides the package"
    return None


def description():
    from nrl_shim.libraries import find

    found = find("vllm")
    answer = alias_version(found.distribution or "", found.version or "")
    return f"importlib.metadata.version('vllm') answers {answer} (distribution {found.distribution})"
