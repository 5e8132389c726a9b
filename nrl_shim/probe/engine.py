"""What an engine's probe module shares with the others: one Probes per module and process, holding its WeightsProbes'
pending refits, what it said, and how a finding is told (one WARNING per kind and process, each one noted in the job
report; strict mode: raised at the engine's next step)."""

from __future__ import annotations

import logging
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nrl_shim.probe.finding import Finding
    from nrl_shim.probe.served import ServedProbe
    from nrl_shim.probe.weights import WeightsProbe

    Probe = WeightsProbe | ServedProbe


_BY_QUIRK: dict[str, Probes] = {}


def probes_for(quirk_id: str, what: str) -> Probes:
    """The engine probe module's Probes in this process (one per quirk id), made at first use."""
    probes = _BY_QUIRK.get(quirk_id)
    if probes is None:
        probes = _BY_QUIRK[quirk_id] = Probes(quirk_id, what)
    return probes


class Probes:
    def __init__(self, quirk_id: str, what: str) -> None:
        self.quirk_id, self.what = quirk_id, what
        self.pending: set = set()  # probes whose refit began and did not end (the engine's next step ends it)
        self.said: set = set()  # kinds of finding said at WARNING in this process
        self.strict = False
        self.finding: str | None = None  # strict mode: a finding to raise at the next step

    def note(self, probe: Probe) -> None:
        from nrl_shim.job_report import recorder

        recorder().note(probe=probe.record())

    def message(self, probe: Probe, finding: Finding) -> str:
        where = probe.where
        ranks = ", ".join(
            f"{key[:2].upper()} rank {where[key]}" for key in ("tp_rank", "dp_rank") if where.get(key) is not None
        )
        return (
            f"[{self.quirk_id}] {self.what}: {where.get('model', '?')} in pid {os.getpid()}"
            + (f" ({ranks})" if ranks else "")
            + f", refit {probe.refits}: {finding.check}: {finding.what} ({finding.size}); likely cause: "
            f"{finding.cause}. See docs/probe.md"
        )

    def say(self, probe: Probe, finding: Finding | None) -> None:
        if finding is None:
            return
        from nrl_shim import report
        from nrl_shim.job_report import recorder

        message = self.message(probe, finding)
        first = finding.kind not in self.said
        self.said.add(finding.kind)
        report.record(self.quirk_id, "warning", "%s", message, level=logging.WARNING if first else logging.DEBUG)
        recorder().note(probe_finding={**probe.record(), "kind": finding.kind, "message": message})
        if self.strict:
            self.finding = message

    def starts(self, probe: WeightsProbe, check: bool = True) -> None:
        """A refit call begins (or, `check=False`, one the engine heard of only once it was over)."""
        self.say(probe, probe.refit_starts(check))
        self.pending.add(probe)

    def step(self) -> None:
        """The engine's next step: the refits since end here (before it serves from them). Never fails the step over
        the probe itself; raises ProbeFindingError in strict mode after a finding."""
        self.end_refits()
        self.raise_finding()

    def end_refits(self) -> None:
        """The refits since the last step end here (a scheduler ends them before its cache is looked up; never
        raises)."""
        if self.pending:
            try:
                for probe in list(self.pending):
                    self.pending.discard(probe)
                    finding = probe.refit_done()
                    live = probe.live_done()
                    self.note(probe)
                    self.say(probe, finding)
                    self.say(probe, live)
            except Exception as error:
                from nrl_shim import report

                report.logger().debug("[%s] could not check the refit: %r", self.quirk_id, error)

    def raise_finding(self) -> None:
        """Strict mode: a finding since the last step raised here, before the step serves from it."""
        if self.finding is not None:
            from nrl_shim.errors import ProbeFindingError

            message, self.finding = self.finding, None
            raise ProbeFindingError(message + " (NRL_SHIM_STRICT=1; NRL_SHIM_PROBE=off turns the probe off)")

    def following(self, probe: WeightsProbe, seconds: float) -> None:
        from nrl_shim import report

        self.note(probe)
        report.first_at_info(
            self.said,
            "following",
            self.quirk_id,
            "info",
            "[%s] %s: the refit probe follows %s's %d parameters in this process (a digest of them took %.0f ms); a "
            "refit that leaves other weights than the ones sent is named (docs/probe.md)",
            self.quirk_id,
            self.what,
            probe.where.get("model", "?"),
            len(probe.current),
            1000 * seconds,
        )

    def clear(self) -> None:
        self.pending.clear()
        self.finding = None
