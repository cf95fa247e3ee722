"""mismatch, from the flight recorder: ranks whose backends recorded different calls at the same
sequence number of a group (F29 rank-conditional collectives, F30 shapes and dtypes).

By default DDP's gradient all-reduces are not events, so a rank-conditional barrier against the
others' gradient all-reduce shows in the events as a rank waiting in a barrier that the others
"never reached". The backends' own records (every collective, DDP's included, numbered per
group) show the two calls side by side; torch's analyzer decides whether they differ
(ddpdoctor.protocol.fr_reading, shared with the post-mortem).
"""

from __future__ import annotations

from collections import Counter, defaultdict

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.fr_evidence import TAG
from ddpdoctor.monitor.judge.rules import RuleOutcome, call_sites, framework_fix, grad_syncs
from ddpdoctor.monitor.judge.rules.mismatch import FIX, _culprits
from ddpdoctor.monitor.model.snapshot import Snapshot, Verdict
from ddpdoctor.protocol.fr_reading import calls_at_first_difference
from ddpdoctor.rank_ranges import named_ranks


def detect(snap: Snapshot) -> RuleOutcome | None:
    if len(snap.flight_recorder) < 2:
        return None
    found = calls_at_first_difference(snap.flight_recorder, snap.run.world_size)
    if found is None:
        return None
    seq, calls, why = found
    frequency: Counter = Counter()
    for dump in snap.flight_recorder:
        for entry in dump.entries:
            frequency[(entry.op, entry.input_sizes, entry.input_dtypes)] += 1
    sides: dict[tuple, list[int]] = defaultdict(list)
    for rank, entry in sorted(calls.items()):
        sides[(entry.op, entry.input_sizes, entry.input_dtypes)].append(rank)
    culprits = _culprits(snap, sides, frequency)
    ordered = sorted(sides.items(), key=lambda kv: (-len(kv[1]), frequency[kv[0]]))
    parts = [f"{named_ranks(ranks)}: {calls[ranks[0]].describe()}" for _, ranks in ordered]
    evidence = [Evidence(f"{TAG}: torch's analyzer at #{seq}: {why}")]
    # The call sites of the ranks' explicit collectives tell which side made the extra call
    # (the others are in a call every rank makes, such as DDP's gradient all-reduce).
    divergence = None
    if len(sides) == 2:
        small, big = sorted(sides.values(), key=len)
        # a side that synced DDP's gradients more often than the other made the extra call,
        # whatever the other went on to (the end's barrier, a metric's all-reduce)
        for side, rest in ((small, big), (big, small)):
            extra = grad_syncs.extra_syncs(snap, side, rest)
            if extra is not None:
                return extra
        for side, rest in ((small, big), (big, small)):
            doing = calls[rest[0]].describe()
            divergence = call_sites.open_extra(snap, side, rest, doing)
            if divergence is not None:
                break
    summary = f"collective mismatch at #{seq} ({TAG}): " + "; ".join(parts)
    if divergence is not None:
        culprits = list(divergence.culprits)
        summary = f"collective mismatch ({TAG} #{seq}): {divergence.describe()}"
        evidence[:0] = divergence.evidence()
    for rank, entry in sorted(calls.items())[:8]:
        rank_dump = snap.fr_of(rank)
        state = rank_dump.state_of(entry) if rank_dump is not None else entry.state
        evidence.append(Evidence(f"{TAG}, rank {rank}: {entry.backend} {entry.describe()} {state}"))
    created = [e.created_t for e in calls.values() if e.created_t is not None]
    onset = max(created) if created else snap.taken_t
    finding = Finding(
        id="mismatch",
        severity=Severity.ERROR,
        summary=summary,
        fix=framework_fix.with_framework(FIX, divergence.call.site if divergence else None),
        ranks=tuple(sorted(culprits)),
        evidence=tuple(evidence),
    )
    return RuleOutcome(
        rule="fr_mismatch",
        findings=(finding,),
        verdict=Verdict.MISMATCH,
        culprits=frozenset(culprits),
        started_t=onset,
        onset_t=onset,
        confirmed=True,  # collectives that can never match: a deadlock
    )
