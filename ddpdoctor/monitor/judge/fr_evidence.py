"""The flight recorder's word on a hang or a mismatch, added to the finding that states it.

The hang and mismatch rules work from the events (the collectives the Python hooks saw); every
rank's flight-recorder dump says the same from the backend's side, with the backend's sequence
numbers, sizes and dtypes, for DDP's gradient buckets too. This module adds that as evidence
(and a short clause to the summary), without changing a verdict.

The reading of the dumps (which calls differ, in torch's analyzer's words) is the one the
post-mortem uses too: ddpdoctor.protocol.fr_reading.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ddpdoctor.findings import Evidence, Finding
from ddpdoctor.monitor.model.snapshot import Snapshot
from ddpdoctor.protocol.flight_recorder import FrRank
from ddpdoctor.protocol.fr_reading import calls_at_first_difference, compare, last_scheduled

TAG = "flight recorder"


def first_difference(
    dumps: Sequence[FrRank], world_size: int | None = None, pg: str = "0"
) -> tuple[int, list[str]] | None:
    """calls_at_first_difference, as evidence lines naming both sides."""
    found = calls_at_first_difference(dumps, world_size, pg)
    if found is None:
        return None
    seq, calls, why = found
    (r0, first), *rest = sorted(calls.items())
    other = next(((r, e) for r, e in rest if compare(first, e, list(calls)) is not None), rest[0])
    line = (
        f"{TAG}: #{seq} differs: rank {r0} {first.describe()} vs "
        f"rank {other[0]} {other[1].describe()} (torch's analyzer: {why})"
    )
    return seq, [line]


def _behind_clause(snap: Snapshot, finding: Finding) -> str | None:
    """ "rank 1's backend never started all_reduce #8" for a hang's culprits, from the dumps."""
    waiting = None
    for d in snap.flight_recorder:
        if d.rank in finding.ranks or d.error is not None:
            continue
        entry = d.pending("0")
        if entry is not None and (waiting is None or entry.seq < waiting.seq):
            waiting = entry
    if waiting is None:
        return None
    behind = []
    for rank in finding.ranks:
        rank_dump = snap.fr_of(rank)
        group = rank_dump.group("0") if rank_dump is not None and rank_dump.error is None else None
        if (
            group is not None
            and rank_dump is not None
            and last_scheduled(rank_dump, "0") < waiting.seq
        ):
            behind.append(rank)
    if not behind:
        return None
    who = f"rank {behind[0]}'s backend" if len(behind) == 1 else f"ranks {behind}' backends"
    return f"{TAG}: {who} never started {waiting.op} #{waiting.seq}"


def _rank_lines(snap: Snapshot, ranks: Sequence[int]) -> list[str]:
    lines: list[str] = []
    for d in snap.flight_recorder:
        if d.rank in ranks or len(lines) < 4:
            lines.append(f"{TAG}, rank {d.rank}: {d.summary()}")
    return lines[:10]


def annotate(findings: Sequence[Finding], snap: Snapshot) -> tuple[Finding, ...]:
    """The findings, with the flight recorder's evidence on the hang and mismatch ones."""
    if not snap.flight_recorder:
        return tuple(findings)
    out = []
    for finding in findings:
        if finding.id not in ("hang", "mismatch") or any(
            e.text.startswith(TAG) for e in finding.evidence
        ):
            out.append(finding)
            continue
        lines: list[str] = []
        summary = finding.summary
        if finding.id == "hang":
            clause = _behind_clause(snap, finding)
            if clause:
                summary += f" ({clause})"
        else:
            diff = first_difference(snap.flight_recorder, snap.run.world_size)
            if diff is not None:
                lines.extend(diff[1])
        lines.extend(_rank_lines(snap, finding.ranks))
        extra = tuple(Evidence(text) for text in lines)
        out.append(replace(finding, summary=summary, evidence=finding.evidence + extra))
    return tuple(out)
