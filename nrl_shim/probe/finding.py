"""What a check of the refit probe found (every check's one result type)."""

from __future__ import annotations


class Finding:
    """One thing wrong at a refit: the check that saw it, what it saw (a sentence), its size, the likely cause."""

    __slots__ = ("kind", "check", "what", "size", "cause")

    def __init__(self, kind: str, check: str, what: str, size: str, cause: str) -> None:
        self.kind, self.check, self.what, self.size, self.cause = kind, check, what, size, cause

    def __repr__(self) -> str:
        return f"Finding({self.check!r}, {self.what!r})"
