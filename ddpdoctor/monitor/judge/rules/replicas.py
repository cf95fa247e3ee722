"""replicas: DDP replicas that stopped being identical (nothing hangs; the model is wrong).

Each rank writes digests of its replica at steps shared by every rank (runtime/replicas.py: the
bit-sum of each parameter, and of each buffer right after DDP broadcast them). Two ranks' digests
of one step either match bit for bit or the replicas differ: DDP hands every rank the same
averaged gradient bytes, so the same optimizer computes the same parameters, whatever
nondeterministic kernels did to the gradients before the average. There is no tolerance to
choose; a healthy job never differs.

The finding says what, where and since when: the first digest step at which the ranks differ
(and the last one at which they agreed), the ranks that differ from the majority (both, for two),
the tensors that differ by name, and the call that wrote the replica on some ranks only
(runtime/replica_calls.py: `load_state_dict` into the DDP model or its optimizer, an LR scheduler
or optimizer step), with its line and step, chosen among the calls whose count differs between
the ranks at that digest, those that began to differ inside the window first.

The verdict is a mismatch (the ranks' replicas do not match), never confirmed: a job that does
not hang is not stopped for it unless the user asks (`ddpdoctor run --stop-on-divergence`). A
model whose buffers DDP does not broadcast (`broadcast_buffers=False`) gets an info: its buffers
are not compared (each rank's BatchNorm statistics are its own, by design).
"""

from __future__ import annotations

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, replica_updates
from ddpdoctor.monitor.judge.rules.replica_compare import (
    Ranks,
    Split,
    by_step,
    call_text,
    compare,
    culprit_call,
    finals,
    models,
    names_text,
    of_snapshot,
    partitions,
    what_of,
)
from ddpdoctor.monitor.model.replicas import ReplicaDigest
from ddpdoctor.monitor.model.snapshot import Snapshot, Verdict
from ddpdoctor.rank_ranges import named_ranks

__all__ = ["at_end", "detect", "diverged", "notes", "of_snapshot", "partitions"]

DIVERGED = "replicas.diverged"
BUFFERS_OFF = "replicas.buffers_not_compared"
AGREED_AT_END = "replicas.agreed"
FIX = (
    "Make every rank do the same to its replica: load a checkpoint on every rank (or on rank 0 "
    "before wrapping the model in DDP, which then broadcasts it), step the LR scheduler, the "
    "optimizer and the GradScaler on every rank, and keep rank-0-only code to logging, "
    "evaluation under `torch.no_grad()` on `model.module`, and saving."
)


def diverged(ranks: Ranks, model: int) -> Finding | None:
    """The earliest divergence among the model's replica groups."""
    found: list[tuple[int, Finding]] = []
    for part in partitions(ranks, model):
        first = first_split(part, model)
        if first is not None:
            found.append((first[0].step, _finding(part, model, *first)))
    return min(found, key=lambda f: f[0])[1] if found else None


First = tuple[Split, dict[int, ReplicaDigest], dict[int, ReplicaDigest], int | None]


def first_split(ranks: Ranks, model: int) -> First | None:
    """The first digests that differ (the split, the digests, the last agreeing ones and their
    step): at a due step, else at the end of the training (the ranks' final digests). With
    digests spaced far apart (a short job of fast steps), the end may be the only one after
    the divergence began."""
    steps = by_step(ranks, model)
    good: dict[int, ReplicaDigest] = {}
    good_step: int | None = None
    for step in sorted(steps):
        digests = steps[step]
        if len(digests) < 2:
            continue
        split = compare(step, digests)
        if split.agree:
            good, good_step = digests, step
            continue
        return split, digests, good, good_step
    final = finals(ranks, model)
    if len(final) >= 2:
        split = compare(max(d.step for d in final.values()), final)
        if not split.agree:
            return split, final, good, good_step
    return None


def _diverged_in(ranks: Ranks, model: int) -> Finding | None:
    first = first_split(ranks, model)
    return _finding(ranks, model, *first) if first is not None else None


def _finding(
    ranks: Ranks,
    model: int,
    split: Split,
    bad: dict[int, ReplicaDigest],
    good: dict[int, ReplicaDigest],
    good_step: int | None,
) -> Finding:
    deviants = split.deviants
    blamed = culprit_call(bad, good, split)
    culprits = blamed[1] if blamed is not None else deviants
    if len(deviants) < len(bad):
        who = f"{named_ranks(list(deviants))}'s replica differs from the other ranks'"
    else:
        who = f"the replicas of {named_ranks(sorted(bad))} differ"
    since = f", after agreeing at step {good_step}" if good_step is not None else ""
    if all(d.final for d in bad.values()):
        since += " (the digests taken as the training ended)"
    which = what_of(next(iter(bad.values())))
    summary = (
        f"replicas diverged: {who} from step {split.step}{since}: {len(split.differing)} of "
        f"{split.compared} tensors of {which} differ ({names_text(split)})"
    )
    evidence: list[Evidence] = []
    if blamed is not None:
        call, makers, counts = blamed
        text = call_text(call, makers, counts)
        summary += f"; {text}"
        site = call.site
        evidence.append(Evidence(text, site.file if site else None, site.line if site else None))
    else:
        summary += "; no call that writes parameters outside the optimizer differs between them"
    final = finals(ranks, model)
    if len(final) >= 2:
        end = compare(max(d.step for d in final.values()), final)
        state = "still differ" if not end.agree else "agree again"
        evidence.append(Evidence(f"at the end (step {end.step}) the replicas {state}"))
    evidence.append(
        Evidence(
            f"step {split.step}: "
            + "; ".join(f"rank {r} holds replica {_group_of(split, r)}" for r in sorted(bad)[:8])
        )
    )
    return Finding(
        id=DIVERGED,
        severity=Severity.ERROR,
        summary=summary,
        fix=FIX,
        ranks=tuple(culprits),
        evidence=tuple(evidence),
    )


def _group_of(split: Split, rank: int) -> int:
    for i, group in enumerate(split.groups):
        if rank in group:
            return i + 1
    return 0


def _onset(ranks: Ranks, model: int, step: int | None) -> float | None:
    """When the last rank wrote its digest of that step (a due step's, else the final ones)."""
    mine = [d for _, ds in ranks for d in ds if d.model == model and d.t is not None]
    times = [d.t for d in mine if d.step == step and not d.final]
    times = times or [d.t for d in mine if d.final]
    return max(t for t in times if t is not None) if times else None


def detect(snap: Snapshot) -> RuleOutcome | None:
    """The first model whose replicas diverged, as a mismatch that is never confirmed; else a
    ZeRO optimizer whose ranks updated its partitions differently (replica_updates.py)."""
    ranks = of_snapshot(snap)
    for model in models(ranks):
        for part in partitions(ranks, model):
            finding = _diverged_in(part, model)
            if finding is None:
                continue
            onset = _onset(part, model, _first_bad_step(part, model))
            return _outcome(finding, onset)
    for model in models(ranks):
        for part in partitions(ranks, model):
            found = replica_updates.updates_differ(part, model)
            if found is not None:
                return _outcome(found[0], _onset(part, model, found[1]))
    return None


def _outcome(finding: Finding, onset: float | None) -> RuleOutcome:
    return RuleOutcome(
        rule="replicas",
        findings=(finding,),
        verdict=Verdict.MISMATCH,
        culprits=frozenset(finding.ranks),
        started_t=onset,
        onset_t=onset,
    )


def _first_bad_step(ranks: Ranks, model: int) -> int | None:
    first = first_split(ranks, model)
    return first[0].step if first is not None else None


def notes(snap: Snapshot) -> RuleOutcome | None:
    """An info per model whose buffers DDP does not broadcast: they are not compared."""
    findings = buffer_notes(of_snapshot(snap))
    return RuleOutcome(rule="replicas", findings=tuple(findings)) if findings else None


def buffer_notes(ranks: Ranks) -> list[Finding]:
    findings: list[Finding] = []
    for model in models(ranks):
        digests = [d for _, ds in ranks for d in ds if d.model == model]
        if any(not d.sync_buffers for d in digests):
            findings.append(
                Finding(
                    id=BUFFERS_OFF,
                    severity=Severity.INFO,
                    summary=(
                        "the DDP model has broadcast_buffers=False: its buffers (BatchNorm "
                        "statistics) are each rank's own and are not compared; its parameters are"
                    ),
                    fix=(
                        "Nothing to do if per-rank statistics are intended; evaluate and save "
                        "from one rank knowing its buffers are its own (or use SyncBatchNorm)."
                    ),
                )
            )
    return findings


def at_end(ranks: Ranks) -> list[Finding]:
    """After the fact: for each model and replica group, how the replicas diverged if they ever
    did (the finding says whether they still differed at the end), else how a ZeRO optimizer's
    ranks updated it differently, else that they agreed at the end (the digests taken as the
    training ended, else the last step every rank digested)."""
    findings: list[Finding] = []
    for model in models(ranks):
        for part in partitions(ranks, model):
            finding = _diverged_in(part, model)
            if finding is None:
                found = replica_updates.updates_differ(part, model)
                finding = found[0] if found is not None else None
            if finding is not None:
                findings.append(finding)
                continue
            final = finals(part, model)
            if len(final) < 2:
                steps = by_step(part, model)
                shared = [s for s in steps if len(steps[s]) >= 2]
                final = steps[max(shared)] if shared else {}
            if len(final) < 2:
                continue
            end = compare(max(d.step for d in final.values()), final)
            findings.append(_agreed(end, final) if end.agree else _end_differs(end, final))
    return findings


def _end_differs(end: Split, final: dict[int, ReplicaDigest]) -> Finding:
    return Finding(
        id=DIVERGED,
        severity=Severity.ERROR,
        summary=(
            f"replicas diverged: the replicas of {named_ranks(sorted(final))} differ at the end "
            f"(step {end.step}): {len(end.differing)} of {end.compared} tensors differ "
            f"({names_text(end)})"
        ),
        fix=FIX,
        ranks=end.deviants,
    )


def _agreed(end: Split, final: dict[int, ReplicaDigest]) -> Finding:
    return Finding(
        id=AGREED_AT_END,
        severity=Severity.INFO,
        summary=(
            f"the replicas of {named_ranks(sorted(final))} agreed at the end (step {end.step}): "
            f"all {end.compared} tensors of {what_of(next(iter(final.values())))} "
            "bit-identical"
        ),
        fix="",
    )
