"""Served vs recomputed (nrl_shim/probe/served.py), the mechanism alone: cache entries as engines hold them (a key and
the object that makes it that entry). On real engines: tests/test_vllm_weights_probe.py (vLLM's prefix cache)."""

import logging

from nrl_shim import report
from nrl_shim.probe.engine import Probes
from nrl_shim.probe.served import ServedProbe


class Entry:
    """A cache entry as an engine holds it: a slot that keeps its place, and the hash it was cached under."""

    def __init__(self, tokens=16):
        self.tokens = tokens
        self.hash = object()

    def recompute(self):  # evicted and cached again (after the refit): a new hash object in the same slot
        self.hash = object()


def cached(entries):
    return [(id(entry), entry.hash) for entry in entries]


def hit(entries):
    return [(id(entry), entry.hash, entry.tokens) for entry in entries]


def probe():
    return ServedProbe("vllm", {"model": "prefix cache of tiny", "dp_rank": 1}, "the prefix cache was not reset")


def test_a_hit_on_an_entry_cached_before_the_refit_is_named_with_its_tokens():
    served, old, other = probe(), [Entry(), Entry(), Entry(8)], Entry()
    served.refit(cached(old))
    finding = served.served(hit([*old, other]), " (request 7)")
    assert finding is not None and finding.check == "served vs recomputed"
    assert "after refit 1 (request 7) was served 40 token(s) of cached KV (3 cache entries)" in finding.what
    assert served.stale_tokens == 40 and finding.cause == "the prefix cache was not reset"


def test_entries_recomputed_after_the_refit_or_cached_after_it_are_not_stale():
    served, old, new = probe(), [Entry(), Entry()], Entry()
    served.refit(cached(old))
    for entry in old:
        entry.recompute()  # the cache was reset and the prefix computed again by the new weights
    assert served.served(hit([*old, new])) is None and served.stale_tokens == 0


def test_a_resync_of_the_same_weights_keeps_the_earlier_notes_and_adds_none():
    served, old, between = probe(), [Entry()], Entry()
    served.refit(cached([]), weights_changed=False)  # before any change: nothing is stale
    assert served.noted() == 0 and served.served(hit(old)) is None
    served.refit(cached(old))  # refit 2 changed the weights: `old` is stale
    served.refit(cached([*old, between]), weights_changed=False)  # refit 3 sent them again: `between` is still right
    assert served.served(hit([between])) is None
    finding = served.served(hit(old))
    assert finding is not None and "after refit 2" in finding.what and served.refits == 3


def test_a_refit_not_known_to_have_changed_the_weights_notes_as_a_change():
    served, old = probe(), [Entry()]
    served.refit(cached(old), weights_changed=None)  # the models are in other processes: not known here
    assert served.noted() == 1 and served.served(hit(old)) is not None


def test_weak_notes_let_go_of_entries_the_cache_let_go_of():
    import gc

    served, kept, dropped = ServedProbe("sglang", {}, "cause", weak=True), Entry(), Entry()
    served.refit([(id(kept), kept), (id(dropped), dropped)])
    del dropped
    gc.collect()
    assert served.noted() == 1 and served.holds(id(kept), kept)
    derived = Entry()
    served.note(id(derived), derived)  # made from a noted entry (a split)
    assert served.served([(id(derived), derived, 4)]) is not None


def test_each_refit_notes_what_the_cache_holds_then():
    served, first, second = probe(), Entry(), Entry()
    served.refit(cached([first]))
    served.refit(cached([first, second]))  # both computed before refit 2
    finding = served.served(hit([second]))
    assert finding is not None and "after refit 2" in finding.what and served.refits == 2


def test_probes_say_a_served_finding_once_at_warning_and_name_the_replica():
    probes, served, old = Probes("vllm-weights-probe", "vLLM weights after a refit"), probe(), [Entry()]
    served.refit(cached(old))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    report.logger().addHandler(handler)  # the shim's logger does not propagate (report.py)
    try:
        probes.say(served, served.served(hit(old)))
        probes.say(served, served.served(hit(old)))
    finally:
        report.logger().removeHandler(handler)
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "prefix cache of tiny in pid" in warnings[0] and "(DP rank 1), refit 1: served vs recomputed" in warnings[0]
