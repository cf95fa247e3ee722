"""The flight recorder's word on a hang or a mismatch, added to the finding that states it.

The hang and mismatch rules work from the events (the collectives the Python hooks saw); every
rank's flight-recorder dump says the same from the backend's side, with the backend's sequence
numbers, sizes and dtypes, for DDP's gradient buckets too. This module adds that as evidence
(and a short clause to the summary), without changing a verdict.

Calls at the same sequence number on two ranks are compared with torch's own analyzer
(torch.distributed.flight_recorder.components.types.Op.match, as `fr_trace` does). Its whole
pipeline (builder.build_db) cannot be used here: it reads pickled dump files from a folder
(loader.read_dir), asserts that every rank's dump is there, exits the process for some options
and logs its report rather than returning it; its per-op comparison works on in-memory entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ddpdoctor.findings import Evidence, Finding
from ddpdoctor.monitor.snapshot import Snapshot
from ddpdoctor.protocol.flight_recorder import FrEntry, FrRank

TAG = "flight recorder"
# torch's match states that mean the calls differ (a state difference is what a hang looks like)
_DIFFERENT = ("COLLECTIVE_TYPE_MISMATCH", "SIZE_OR_SYNTAX_MISMATCH", "COLLECTIVE_DTYPE_MISMATCH")


def compare(a: FrEntry, b: FrEntry, ranks: Sequence[int]) -> str | None:
    """Why two calls at one sequence number differ, in torch's analyzer's words; None when they
    match. Without the analyzer (an old torch, an op it does not model) only the op is compared:
    sizes may legitimately differ between ranks (gather, scatter, all_to_all).

    Identical calls match without asking: the analyzer lives in torch, and importing torch in the
    monitor costs two seconds of CPU, which a healthy job's dumps (asked while its ranks start)
    would otherwise take from the ranks on a small machine."""
    if same_call(a, b):
        return None
    try:
        from torch.distributed.flight_recorder.components.types import Op

        members = {a.pg_name: set(ranks)}
        info = Op(a.torch_event(), members, a.pg_name).match(
            Op(b.torch_event(), members, a.pg_name)
        )
    except Exception:  # noqa: BLE001 - no analyzer, or an op it does not know
        return f"COLLECTIVE_TYPE_MISMATCH: {a.op} vs {b.op}" if a.op != b.op else None
    state = getattr(info.state, "name", "")
    return f"{state}: {info.culprit}" if state in _DIFFERENT else None


def same_call(a: FrEntry, b: FrEntry) -> bool:
    """The same op on the same tensors: what torch's analyzer matches in every case."""
    return (
        a.op == b.op
        and a.p2p == b.p2p
        and a.input_sizes == b.input_sizes
        and a.input_dtypes == b.input_dtypes
        and a.output_sizes == b.output_sizes
        and a.output_dtypes == b.output_dtypes
    )


def calls_at_first_difference(
    dumps: Sequence[FrRank], world_size: int | None = None, pg: str = "0"
) -> tuple[int, dict[int, FrEntry], str] | None:
    """The first sequence number of group `pg` where the ranks' backends recorded different
    calls: (seq, each rank's call, torch's analyzer's reason); None when every number matches.
    `world_size`: the default group's size (torch's analyzer checks gather sizes against it)."""
    usable = [d for d in dumps if d.error is None]
    if len(usable) < 2:
        return None
    ranks = list(range(world_size)) if world_size else sorted({d.rank for d in usable})
    seqs = sorted({e.seq for d in usable for e in d.entries if e.pg == pg and not e.p2p})
    for seq in seqs:
        calls = {d.rank: e for d in usable if (e := d.entry(pg, seq)) is not None}
        if len(calls) < 2:
            continue
        first = next(iter(calls.values()))
        for entry in list(calls.values())[1:]:
            why = compare(first, entry, ranks)
            if why is not None:
                return seq, calls, why
    return None


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
        if group is not None and group.last_enqueued < waiting.seq:
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
