"""Findings about the run's own record: files of the run that cannot be read, and event lines
no rank of the job can have written. A verdict made without them must say so."""

from __future__ import annotations

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.model.state import RunState


def skipped_event_findings(state: RunState) -> list[Finding]:
    """Event lines whose rank lies outside the job's world: not folded in (no view is made per
    rank up to a number a file states), and said here so the verdict is read knowing it."""
    if not state.skipped_events or state.first_skipped is None:
        return []
    rel, line, rank = state.first_skipped
    world = state.world_size
    return [
        Finding(
            "run.bad_events",
            Severity.WARNING,
            f"{state.skipped_events} event line(s) skipped: rank {rank} is outside the world "
            f"of {world} ranks ({rel}:{line})",
            "The run directory holds events no rank of this job can have written (a file edited "
            "or copied in, or a corrupted one); the verdict is from the other events.",
        )
    ]


def world_findings(state: RunState) -> list[Finding]:
    """run.json's world size, when the ranks' own hellos (their launch's WORLD_SIZE) say a
    smaller one: the ranks' word is taken, and the file's claim said."""
    disputed = state.world_disputed
    if disputed is None:
        return []
    claimed, world = disputed
    return [
        Finding(
            "run.world_disputed",
            Severity.WARNING,
            f"run.json says a world of {claimed} ranks, but the ranks' own hellos say {world}: "
            f"the run is judged as {world} ranks",
            "run.json was edited or copied from another run, or the job ran fewer ranks than "
            "launched (an elastic job's smaller world). Nothing is allocated by the file's number.",
        )
    ]


def unreadable_findings(unreadable: dict[str, str]) -> list[Finding]:
    """A file of the run (or events/ itself) that cannot be read: what it says is unknown, so
    a verdict without it must say so."""
    return [
        Finding(
            "run.unreadable",
            Severity.ERROR,
            f"cannot read {rel}: {why}: the ranks it records are not seen",
            "Make the run directory readable to this user (chmod -R u+rX RUN_DIR), or watch it "
            "as the user who ran it.",
        )
        for rel, why in sorted(unreadable.items())
    ]
