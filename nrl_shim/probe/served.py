"""Served vs recomputed (docs/probe.md, check a): KV computed under older weights served to a request after a refit.

An engine's prefix cache keys KV by tokens, not by the weights that computed it. At each refit, before the engine's
cache is next looked up, the probe notes every entry the cache holds then (its key and the object that proves it is
still that entry: vLLM's block and its hash, SGLang's tree node); a later lookup that returns a noted entry still
holding the same object is KV from before the refit served as if recomputed: the tokens of the request that follow
attend to older weights' keys and values. An entry recomputed after the refit is a new object (a new hash, a new
node), so it never counts; an entry evicted and reused holds another one. Exact: no noise, no threshold.

Nothing is copied or held but the noted keys and objects (one reference per cached entry, replaced at each refit);
the lookup's own result is read, never changed. A refit that sent the same weights again (a re-sync: KV computed since
the last change is still right) is given as `weights_changed=False`: the earlier notes stay, nothing new is noted.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, MutableMapping
from typing import Any

from nrl_shim.probe.finding import Finding

CHECK = "served vs recomputed"
KIND = "stale KV served"


class ServedProbe:
    """One engine cache's entries at its latest refit, and the check of each lookup after it."""

    def __init__(self, engine: str, where: dict, cause: str, weak: bool = False) -> None:
        self.engine, self.where, self.cause = engine, where, cause
        self.refits = 0
        self.noted_at = 0  # the refit whose notes are held (a re-sync of the same weights keeps the earlier ones)
        # entry key -> what made it that entry (identity). `weak`: the identities are the entries themselves (SGLang's
        # tree nodes), held weakly: a node the cache let go of leaves the notes with it.
        self._weak = weak
        self._before: MutableMapping[Hashable, Any] = self._notes()
        self.stale_tokens = 0  # tokens served from before the latest refit, since it

    def _notes(self) -> MutableMapping[Hashable, Any]:
        import weakref

        return weakref.WeakValueDictionary() if self._weak else {}

    def refit(self, entries: Iterable[tuple[Hashable, object]], weights_changed: bool | None = True) -> None:
        """A refit, before the cache is next looked up: `entries` are every (key, identity) the cache holds now.
        `weights_changed=False`: the same weights again (a re-sync): the notes of the last refit that changed them stay;
        None: not known (noted as a change)."""
        self.refits += 1
        if weights_changed is False:
            return  # what was stale before stays stale; what came since is still right
        self.stale_tokens = 0
        self.noted_at = self.refits
        self._before = self._notes()
        self._before.update(entries)

    def noted(self) -> int:
        return len(self._before)

    def holds(self, key: Hashable, identity: object) -> bool:
        return self._before.get(key) is identity

    def note(self, key: Hashable, identity: object) -> None:
        """An entry made later from a noted one (SGLang splits a tree node: the new node holds part of its KV)."""
        self._before[key] = identity

    def served(self, entries: Iterable[tuple[Hashable, object, int]], request: str = "") -> Finding | None:
        """A lookup's result: (key, identity, tokens) of each entry it returned. A finding when some were cached
        before the latest refit and are the same entries still."""
        if not self._before:
            return None
        stale = [tokens for key, identity, tokens in entries if self._before.get(key) is identity]
        if not stale:
            return None
        tokens = sum(stale)
        self.stale_tokens += tokens
        return Finding(
            KIND,
            CHECK,
            f"a request scheduled after refit {self.noted_at}{request} was served {tokens} token(s) of cached KV "
            f"({len(stale)} cache entr{'y' if len(stale) == 1 else 'ies'}) computed before that refit, by older "
            "weights, instead of recomputing them",
            f"{tokens} prompt tokens from older weights",
            self.cause,
        )

    def record(self) -> dict:
        return {"engine": self.engine, **self.where, "refit": self.refits, "check": CHECK}
