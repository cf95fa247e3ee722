"""`ddpdoctor explain` of PyTorch flight-recorder dumps, alone or with the job's logs.

The dumps are read once (ddpdoctor.protocol.fr_reading, the reading the live diagnosis uses
too); this module says what that reading means in plain words, with the fix, and tells it
together with what the logs say as one story: the group that diverged first is the headline;
the logs' errors of the ranks that waited are its consequences (a timeout, a peer that closed
its socket, torchrun's table naming the first rank it saw fail), and a culprit's own error (its
traceback) is the reason it never came.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ddpdoctor.findings import Evidence, Finding, Severity, sort_findings
from ddpdoctor.protocol.flight_recorder import FrEntry, FrRank
from ddpdoctor.protocol.fr_reading import GroupReading, read_groups, user_first
from ddpdoctor.rank_ranges import named_ranks

TAG = "flight recorder"
FIX_NEVER_REACHED = (
    "Find why {who} stopped before {call}: the frames below show where the others called it. "
    "Look for a branch on the rank, uneven data (a rank that runs out of batches first: "
    "DistributedSampler(drop_last=True), or `model.join()`), an exception caught on one rank, "
    "or a rank stuck in its own work (py-spy dump --pid <pid>). Make every rank of the group "
    "call the same collectives in the same order."
)
FIX_MISMATCH = (
    "Every rank of a group must call the same collectives, in the same order, with the same "
    "sizes and dtypes: look for a collective inside an `if rank == ...` branch, a tensor whose "
    "size depends on the rank's data (pad it, or all_gather the sizes first), or a dtype that "
    "differs between ranks. TORCH_DISTRIBUTED_DEBUG=DETAIL checks every call at run time."
)
# log findings that are what a rank waiting in a collective logs when its peer never comes
WAITERS_ERRORS = ("gloo.", "watchdog.", "nccl.remote_error", "torchrun.", "c10d.")


def dump_findings(dumps: Sequence[FrRank], world_size: int | None = None) -> list[Finding]:
    """What the dumps say, worst first: one finding per group that diverged, and a note per
    dump that could not be read. Nothing when every group is consistent."""
    out = [
        Finding(
            id="fr.unreadable",
            severity=Severity.WARNING,
            summary=f"rank {d.rank}'s flight-recorder dump was not read: {d.error}",
            fix="Dump again with the same torch version, or pass the file torch wrote.",
            ranks=(d.rank,),
        )
        for d in dumps
        if d.error is not None
    ]
    for reading in read_groups(dumps, world_size):
        finding = group_finding(reading)
        if finding is not None:
            out.append(finding)
    return sort_findings(out)


def group_finding(r: GroupReading) -> Finding | None:
    if r.kind == "mismatch":
        return _mismatch(r)
    if r.kind == "never_reached":
        return _never_reached(r)
    if r.kind == "no_dump":
        return _no_dump(r)
    return None


def _call(r: GroupReading) -> FrEntry:
    return next(iter(r.calls.values()))


def _where(r: GroupReading) -> str:
    return "" if r.pg == "0" else f" of {r.label}"


def _mismatch(r: GroupReading) -> Finding:
    sides: dict[tuple, list[int]] = {}
    for rank, entry in sorted(r.calls.items()):
        sides.setdefault((entry.op, entry.input_sizes, entry.input_dtypes), []).append(rank)
    ordered = sorted(sides.values(), key=lambda ranks: (-len(ranks), ranks))
    parts = [f"{named_ranks(ranks)} called {_plain(r.calls[ranks[0]])}" for ranks in ordered]
    # the smaller side is the odd one out; with two equal sides, the one that is not rank 0's
    culprits = ordered[-1] if len(ordered) > 1 else []
    summary = f"Collective mismatch at #{r.seq}{_where(r)}: " + "; ".join(parts)
    evidence = [Evidence(f"{TAG}: torch's analyzer at #{r.seq}: {r.why}")]
    evidence += _call_lines(r)
    return Finding(
        id="fr.mismatch",
        severity=Severity.ERROR,
        summary=summary,
        fix=FIX_MISMATCH,
        ranks=tuple(culprits),
        evidence=tuple(evidence),
    )


def _never_reached(r: GroupReading) -> Finding:
    call = _call(r)
    waiting = r.waiting
    who = named_ranks(r.never_reached)
    summary = f"{who} never reached {call.op} #{r.seq}{_where(r)}"
    waits = [p for p in waiting if p.waited_s is not None]
    verb = "waits" if len(waiting) == 1 else "wait"
    summary += f": {named_ranks(p.rank for p in waiting)} {verb} in it"
    if waits:
        summary += f" ({max(p.waited_s or 0.0 for p in waits):.1f} s when dumped)"
    summary += _behind_clause(r)
    fix = FIX_NEVER_REACHED.format(who=who, call=f"{call.op} #{r.seq}")
    return Finding(
        id="fr.never_reached",
        severity=Severity.ERROR,
        summary=summary,
        fix=fix,
        ranks=r.never_reached,
        evidence=tuple(_call_lines(r)),
    )


def _no_dump(r: GroupReading, failed: Sequence[int] = ()) -> Finding:
    """Members left no dump and no call is pending. `failed`: ranks with a dump whose logs say
    they failed: then they failed in that call, and the others never reached it."""
    call = _call(r)
    ranks = sorted(r.calls)
    gone = named_ranks(r.no_dump)
    fix = FIX_NEVER_REACHED.format(who=gone, call=f"{call.op} #{r.seq}")
    if failed:
        return Finding(
            id="fr.never_reached",
            severity=Severity.ERROR,
            summary=(
                f"{gone} never reached {call.op} #{r.seq}{_where(r)}: {named_ranks(failed)} "
                f"failed in it (its last recorded call, {_plain(call)}) and {gone} left no "
                "dump: it ended or hung before it"
            ),
            fix=fix,
            ranks=r.no_dump,
            evidence=tuple(_call_lines(r)),
        )
    summary = (
        f"{gone} left no flight-recorder dump; the last call {named_ranks(ranks)} recorded"
        f"{_where(r)} is {_plain(call)}, recorded as finished (gloo records a call that failed "
        f"the same way). If the job failed there, {gone} ended or hung before it: read its log"
    )
    return Finding(
        id="fr.no_dump",
        severity=Severity.WARNING,
        summary=summary,
        fix=fix,
        ranks=r.no_dump,
        evidence=tuple(_call_lines(r)),
    )


def _behind_clause(r: GroupReading) -> str:
    parts = []
    for rank in r.never_reached:
        pos = r.position(rank)
        if pos is None:
            parts.append(f"rank {rank} left no dump")
        else:
            parts.append(
                f"rank {rank} is {pos.behind} collective{'s' if pos.behind != 1 else ''} behind"
                f" (last scheduled #{pos.last_scheduled})"
            )
    return "; " + ", ".join(parts) if parts else ""


def _plain(entry: FrEntry) -> str:
    """ "all_reduce #6 of float32[4]" """
    return f"{entry.op} #{entry.seq} of {entry.tensors()}"


def _call_lines(r: GroupReading) -> list[Evidence]:
    lines = []
    for rank, entry in sorted(r.calls.items())[:8]:
        pos = r.position(rank)
        state = "pending" if pos and pos.pending is entry else "recorded"
        waited = (
            f", {pos.waited_s:.1f} s when dumped"
            if pos and pos.waited_s is not None and (pos.pending is entry)
            else ""
        )
        lines.append(
            Evidence(
                f"{TAG}, rank {rank}: {entry.backend} {entry.describe()} {state}{waited}"
                f" (last completed #{pos.last_completed if pos else '?'})"
            )
        )
        frames = user_first(entry.frames)
        if frames:
            lines.append(Evidence(f"{TAG}, rank {rank} called it at: " + " < ".join(frames[:4])))
    for rank in r.never_reached[:8]:
        pos = r.position(rank)
        if pos is None:
            lines.append(Evidence(f"{TAG}, rank {rank}: no dump (a member of {r.label})"))
        else:
            lines.append(
                Evidence(
                    f"{TAG}, rank {rank}: last scheduled #{pos.last_scheduled}, last completed "
                    f"#{pos.last_completed}"
                )
            )
    return lines


def explain_dumps(
    dumps: Sequence[FrRank], logs: Sequence[Finding] = (), world_size: int | None = None
) -> list[Finding]:
    """The dumps' findings and the logs', told as one story.

    The headline is the dumps' first divergent group. A log error of a rank that never reached
    the call (its traceback: why it never came) joins the headline; the other ranks' errors
    (timeouts, closed sockets, torchrun's failure table) are what waiting for it looks like, so
    they stay, as warnings. A group whose ranks left no dump becomes the headline when the ranks
    with a dump failed in the logs: they failed in that call, waiting for the others."""
    fr = dump_findings(dumps, world_size)
    if not fr:
        return list(logs)
    readings = [r for r in read_groups(dumps, world_size) if r.kind != "consistent"]
    head, *rest = fr
    errors = [f for f in logs if f.severity is Severity.ERROR]
    if head.id == "fr.no_dump" and readings:
        failed = sorted({r for f in errors for r in f.ranks if r not in head.ranks})
        if not failed:
            return sort_findings([*fr, *logs])
        head = _no_dump(readings[0], failed)
    if head.severity is not Severity.ERROR:
        return sort_findings([*fr, *logs])
    culprits = set(head.ranks)
    own = [f for f in errors if f.ranks and set(f.ranks) <= culprits]
    if own:
        reasons = "; ".join(f"{named_ranks(f.ranks)}'s log: {f.summary}" for f in own[:2])
        head = replace(
            head,
            summary=f"{head.summary}. Why: {reasons}",
            evidence=head.evidence + tuple(e for f in own for e in f.evidence[:3]),
        )
    told = []
    for f in logs:
        if f in own:
            continue
        if f.severity is Severity.ERROR:
            f = replace(
                f,
                severity=Severity.WARNING,
                summary=f"{f.summary} (a consequence: {named_ranks(head.ranks)} never came)",
            )
        told.append(f)
    # another group whose only news is that the culprits left no dump says nothing more
    rest = [f for f in rest if not (f.id == "fr.no_dump" and set(f.ranks) <= culprits)]
    demoted = [replace(f, severity=Severity.INFO) if f.severity is Severity.ERROR else f
               for f in rest]  # fmt: skip
    return [head, *sort_findings([*demoted, *told])]
