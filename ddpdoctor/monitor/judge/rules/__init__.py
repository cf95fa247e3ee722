"""Diagnosis rules: each a pure function of a Snapshot that returns an RuleOutcome (or None).

A rule never reads files or clocks: everything it needs is in the snapshot (per-rank state, the
collectives each rank started, times, thresholds, stacks), so every rule is tested on snapshots
built by hand. ddpdoctor.monitor.judge.diagnose runs them and picks the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddpdoctor.findings import Finding
from ddpdoctor.monitor.model.snapshot import Verdict, WaitView


@dataclass(frozen=True)
class RuleOutcome:
    """What one rule concluded."""

    rule: str
    findings: tuple[Finding, ...] = ()
    verdict: Verdict | None = None  # the problem verdict this rule establishes, if any
    culprits: frozenset[int] = field(default_factory=frozenset)
    started_t: float | None = None  # when the problem began (culprit's last progress, ...)
    onset_t: float | None = None  # when the verdict's condition first held
    stalled: frozenset[int] = field(default_factory=frozenset)  # ranks to show as stalled
    waiting_on: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (rank, culprits it waits on)
    # Certain enough to stop the job on: the launcher's stop policy acts on nothing less.
    confirmed: bool = False
    waits: tuple[WaitView, ...] = ()  # who waits for whom (the wait rule)
    stopped_t: float | None = None  # when the launcher stopped the job for it (a held outcome)


def confirmed_mismatch(rule: str, finding: Finding, onset: float | None) -> RuleOutcome:
    """A confirmed mismatch of the finding's ranks that held from `onset` (the mismatch rules
    all end so: the ranks' calls, contracts or gradient syncs differ, a fact of their events)."""
    return RuleOutcome(
        rule=rule,
        findings=(finding,),
        verdict=Verdict.MISMATCH,
        confirmed=True,
        culprits=frozenset(finding.ranks),
        started_t=onset,
        onset_t=onset,
    )


def fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"
