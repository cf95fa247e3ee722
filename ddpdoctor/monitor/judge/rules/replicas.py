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

from collections.abc import Sequence
from dataclasses import dataclass

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome
from ddpdoctor.monitor.model.replicas import ReplicaCall, ReplicaDigest
from ddpdoctor.monitor.model.snapshot import Snapshot, Verdict
from ddpdoctor.rank_ranges import named_ranks

DIVERGED = "replicas.diverged"
BUFFERS_OFF = "replicas.buffers_not_compared"
AGREED_AT_END = "replicas.agreed"
NAMES_SHOWN = 6
FIX = (
    "Make every rank do the same to its replica: load a checkpoint on every rank (or on rank 0 "
    "before wrapping the model in DDP, which then broadcasts it), step the LR scheduler, the "
    "optimizer and the GradScaler on every rank, and keep rank-0-only code to logging, "
    "evaluation under `torch.no_grad()` on `model.module`, and saving."
)


@dataclass(frozen=True)
class Split:
    """The ranks' digests of one step, compared."""

    step: int
    groups: tuple[tuple[int, ...], ...]  # ranks with equal digests, the largest group first
    differing: tuple[str, ...]  # tensor names whose digests differ
    compared: int  # how many tensors were compared

    @property
    def agree(self) -> bool:
        return len(self.groups) <= 1

    @property
    def deviants(self) -> tuple[int, ...]:
        """The ranks outside a strict majority; every rank when no group is the majority."""
        if self.agree:
            return ()
        if len(self.groups[0]) > len(self.groups[1]):
            return tuple(sorted(r for g in self.groups[1:] for r in g))
        return tuple(sorted(r for g in self.groups for r in g))


def compare(step: int, digests: dict[int, ReplicaDigest]) -> Split:
    """Compare the ranks' digests of one step on the tensors every one of them digested."""
    maps = {rank: d.by_name() for rank, d in digests.items()}
    common = sorted(set.intersection(*(set(m) for m in maps.values()))) if maps else []
    keyed: dict[tuple[int, ...], list[int]] = {}
    for rank, values in sorted(maps.items()):
        keyed.setdefault(tuple(values[n] for n in common), []).append(rank)
    groups = sorted((tuple(g) for g in keyed.values()), key=lambda g: (-len(g), g))
    differing: tuple[str, ...] = ()
    if len(groups) > 1:
        differing = tuple(n for n in common if len({m[n] for m in maps.values()}) > 1)
    return Split(step, tuple(groups), differing, len(common))


# Each rank's digests: (rank, its digests), from a snapshot's views or read from a run directory.
Ranks = Sequence[tuple[int, Sequence[ReplicaDigest]]]


def of_snapshot(snap: Snapshot) -> Ranks:
    return [(v.rank, v.replica_digests) for v in snap.ranks if v.replica_digests]


def _by_step(ranks: Ranks, model: int) -> dict[int, dict[int, ReplicaDigest]]:
    steps: dict[int, dict[int, ReplicaDigest]] = {}
    for rank, digests in ranks:
        for digest in digests:
            if digest.model == model and not digest.final:
                steps.setdefault(digest.step, {})[rank] = digest
    return steps


def _finals(ranks: Ranks, model: int) -> dict[int, ReplicaDigest]:
    out: dict[int, ReplicaDigest] = {}
    for rank, digests in ranks:
        for digest in digests:
            if digest.model == model and digest.final:
                out[rank] = digest
    return out


def _calls(digest: ReplicaDigest | None) -> dict[object, ReplicaCall]:
    return {c.key: c for c in digest.calls} if digest is not None else {}


def _count(calls: dict[object, ReplicaCall], key: object) -> int:
    call = calls.get(key)
    return call.count if call is not None else 0


def culprit_call(
    bad: dict[int, ReplicaDigest], good: dict[int, ReplicaDigest], split: Split
) -> tuple[ReplicaCall, tuple[int, ...], dict[int, int]] | None:
    """The call whose count differs between the ranks at the first differing digest, preferring
    one that began to differ since the last agreeing one, then one into the DDP model; with the
    ranks that made it more often than the rest and each rank's count."""
    now = {rank: _calls(d) for rank, d in bad.items()}
    before = {rank: _calls(good.get(rank)) for rank in bad}
    keys = {k for calls in now.values() for k in calls}
    best: tuple[tuple[int, int, int], object] | None = None
    for key in keys:
        counts = {rank: _count(calls, key) for rank, calls in now.items()}
        if len(set(counts.values())) < 2:
            continue
        earlier = {rank: _count(before[rank], key) for rank in bad}
        fresh = len(set(earlier.values())) < 2 if good else True
        call = next(now[r][key] for r in sorted(now) if key in now[r])
        is_load = call.what.endswith("load_state_dict")
        rank_key = (0 if fresh else 1, 0 if call.ddp else 1, 0 if is_load else 1)
        if best is None or rank_key < best[0]:
            best = (rank_key, key)
    if best is None:
        return None
    key = best[1]
    counts = {rank: _count(calls, key) for rank, calls in now.items()}
    top = max(counts.values())
    makers = tuple(sorted(r for r, c in counts.items() if c == top))
    deviants = set(split.deviants)
    if deviants and len(deviants) < len(bad):  # a majority: the call the minority made
        minority = {r: c for r, c in counts.items() if r in deviants}
        majority = {c for r, c in counts.items() if r not in deviants}
        odd = tuple(sorted(r for r, c in minority.items() if c not in majority))
        makers = odd or makers
    call = now[makers[0]][key]
    return call, makers, counts


def _call_text(call: ReplicaCall, makers: tuple[int, ...], counts: dict[int, int]) -> str:
    where = f" at {call.site.describe()}" if call.site is not None else ""
    first = call.steps[0] if call.steps else None
    if call.count == 1 and first is not None:
        when = f" at step {first}"
    elif first is not None:
        when = f" {call.count} times, from step {first}"
    else:
        when = f" {call.count} times"
    others = sorted(r for r in counts if r not in makers)
    never = [r for r in others if counts[r] == 0]
    some = [r for r in others if counts[r]]
    parts = [f"{named_ranks(never)} never did"] if never else []
    parts += [f"rank {r} {counts[r]} times" for r in some[:4]]
    tail = f" ({'; '.join(parts)})" if parts else ""
    return f"{named_ranks(list(makers))} called {call.what}{where}{when}{tail}"


def _names(split: Split) -> str:
    shown = ", ".join(split.differing[:NAMES_SHOWN])
    more = len(split.differing) - NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def diverged(ranks: Ranks, model: int) -> Finding | None:
    steps = _by_step(ranks, model)
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
        return _finding(ranks, model, split, digests, good, good_step)
    return None


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
    which = "model" if model == 0 else f"DDP model #{model}"
    summary = (
        f"replicas diverged: {who} from step {split.step}{since}: {len(split.differing)} of "
        f"{split.compared} tensors of the {which} differ ({_names(split)})"
    )
    evidence: list[Evidence] = []
    if blamed is not None:
        call, makers, counts = blamed
        text = _call_text(call, makers, counts)
        summary += f"; {text}"
        site = call.site
        evidence.append(Evidence(text, site.file if site else None, site.line if site else None))
    else:
        summary += "; no call that writes parameters outside the optimizer differs between them"
    final = _finals(ranks, model)
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


def models(ranks: Ranks) -> list[int]:
    return sorted({d.model for _, digests in ranks for d in digests})


def _onset(ranks: Ranks, model: int, step: int | None) -> float | None:
    times = [
        d.t
        for _, digests in ranks
        for d in digests
        if d.model == model and d.step == step and d.t is not None and not d.final
    ]
    return max(times) if times else None


def detect(snap: Snapshot) -> RuleOutcome | None:
    """The first model whose replicas diverged, as a mismatch that is never confirmed."""
    ranks = of_snapshot(snap)
    for model in models(ranks):
        finding = diverged(ranks, model)
        if finding is None:
            continue
        onset = _onset(ranks, model, _first_bad_step(ranks, model))
        return RuleOutcome(
            rule="replicas",
            findings=(finding,),
            verdict=Verdict.MISMATCH,
            culprits=frozenset(finding.ranks),
            started_t=onset,
            onset_t=onset,
        )
    return None


def _first_bad_step(ranks: Ranks, model: int) -> int | None:
    steps = _by_step(ranks, model)
    for step in sorted(steps):
        if len(steps[step]) >= 2 and not compare(step, steps[step]).agree:
            return step
    return None


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
    """After the fact: for each model, how the replicas diverged if they ever did (the finding
    says whether they still differed at the end), else that they agreed at the end (the digests
    taken as the training ended, else the last step every rank digested)."""
    findings: list[Finding] = []
    for model in models(ranks):
        finding = diverged(ranks, model)
        if finding is not None:
            findings.append(finding)
            continue
        final = _finals(ranks, model)
        if len(final) < 2:
            steps = _by_step(ranks, model)
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
            f"({_names(end)})"
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
            f"all {end.compared} tensors bit-identical"
        ),
        fix="",
    )
