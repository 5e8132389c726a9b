"""The `nrl_shim` logger: every change to a user's configuration is logged once, with before -> after and why.

Every line a fix logs about what it did goes through the helpers below: each record carries its fix and its kind
(`record.nrl_shim = {"quirk": id, "kind": kind}`, one of job_report.KINDS), which is what the job report reads; the
text is for people.
"""

from __future__ import annotations

import logging
import sys

from .errors import SettingsError
from .job_report import TAG
from .settings import parse_level

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Hashable
    from typing import Literal

    Kind = Literal["changed", "unchanged", "skipped", "unverified", "warning", "error", "info"]  # job_report.KINDS

_LOGGER = logging.getLogger("nrl_shim")
_seen: set[tuple[str, ...]] = set()


def level_from_env() -> int:
    import os

    try:
        raw = os.environ.get("NRL_SHIM_LOG_LEVEL", "").strip()
        return parse_level("NRL_SHIM_LOG_LEVEL", raw) if raw else logging.INFO
    except SettingsError:
        return logging.INFO  # activation reports the bad value itself


def configure(level: int) -> None:
    """Called by activation at every activation (so NRL_SHIM_LOG_LEVEL follows each one), once logging is in use."""
    log = logger()
    if log.level != level:  # setLevel clears the cache of every logger in the process: only on a real change
        log.setLevel(level)


def logger() -> logging.Logger:
    """The configured `nrl_shim` logger. Our own stderr handler, so INFO reaches users whose app configured no
    logging; propagate=False so an app that did configure logging does not print every line twice. Reconfigure
    freely: `logging.getLogger("nrl_shim").handlers[:] = []; ...propagate = True`."""
    if not getattr(_LOGGER, "_nrl_shim_configured", False):  # once per process
        # Until activation configures it (it does at every activation): the environment's level, else INFO.
        _LOGGER.setLevel(level_from_env())
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("nrl_shim %(levelname)s: %(message)s"))
        _LOGGER.addHandler(handler)
        # The job report (NRL_SHIM_REPORT_DIR): the same records, kept per process; inert while the variable is unset.
        from .job_report import recorder

        _LOGGER.addHandler(recorder())
        _LOGGER.propagate = False
        setattr(_LOGGER, "_nrl_shim_configured", True)  # noqa: B010  (an attribute Logger does not declare)
    return _LOGGER


_LEVELS = {
    "skipped": logging.WARNING,
    "unverified": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def record(
    quirk_id: str | None,
    kind: Kind,
    message: str,
    *args: object,
    level: int | None = None,
    state: str | None = None,
) -> None:
    """Log one line of what fix `quirk_id` (None: the shim's shared parts) did, of `kind` (one of job_report.KINDS),
    at `level` (default: WARNING for skipped/unverified/warning, ERROR for error, INFO for the rest); `state`: the
    fix's verdict (registry.verdict) where activation says it, kept in the job report. Not deduplicated: the helpers
    below are."""
    if level is None:
        level = _LEVELS.get(kind, logging.INFO)
    tag = {"quirk": quirk_id, "kind": kind, **({"state": state} if state else {})}
    logger().log(level, message, *args, extra={TAG: tag})


def changed(quirk_id: str, what: str, before: object, after: object, why: str) -> None:
    """Log one configuration change, once per process for the same (quirk, what, before, after)."""
    key = (quirk_id, what, repr(before), repr(after))
    if key in _seen:
        return
    _seen.add(key)
    record(quirk_id, "changed", "[%s] %s: %r -> %r (%s)", quirk_id, what, before, after, why)


def unchanged(quirk_id: str, what: str, why: str, state: str | None = None) -> None:
    """Log once per process that a fix looked at `what` and left it as it is."""
    key = (quirk_id, "unchanged", what)
    if key in _seen:
        return
    _seen.add(key)
    record(quirk_id, "unchanged", "[%s] %s: nothing to change (%s)", quirk_id, what, why, state=state)


def warn_once(quirk_id: str, key: str, message: str, kind: Kind = "warning", state: str | None = None) -> None:
    """Log one warning, once per process for the same (quirk, key); `kind` "unverified" or "skipped" for activation's
    own, with the verdict's `state`."""
    marker = (quirk_id, "warning", key)
    if marker in _seen:
        return
    _seen.add(marker)
    record(quirk_id, kind, "%s", message, state=state)


def first_at_info(
    said: set[Hashable],
    key: Hashable,
    quirk_id: str,
    kind: Kind,
    message: str,
    *args: object,
    later: tuple[object, ...] | None = None,
) -> bool:
    """One line at INFO the first time `key` is said in `said` (a set the fix keeps per engine, so each engine says it
    once), at DEBUG every time after: `later` = (message, *args) for those, else the same line. Returns whether this
    one was at INFO."""
    first = key not in said
    said.add(key)
    if first:
        record(quirk_id, kind, message, *args, level=logging.INFO)
    elif later is not None:
        record(quirk_id, kind, str(later[0]), *later[1:], level=logging.DEBUG)
    else:
        record(quirk_id, kind, message, *args, level=logging.DEBUG)
    return first
