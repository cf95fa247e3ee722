"""wait: ranks wait in a collective for ranks that are busy in their own code (not a hang).

The standard recipes make ranks wait: rank 0 downloads and unpacks the data set while the others
wait in `dist.barrier()`; rank 0 evaluates or saves a checkpoint between epochs while the others
wait in the next all-reduce. The waiting ranks look exactly like the victims of a hang; what
tells them apart is the rank they wait for: busy (CPU advancing, stack moving, I/O flowing, its
GPU working: ddpdoctor.monitor.model.progress) means it will get there.

Every current wait is listed (diagnosis.json `waits`), the blocked ones too (the hang rule makes
those a hang past the threshold). A wait for busy ranks is a finding `wait.busy_rank`: info while
short, a warning past the warning threshold, an error as it nears the process group's own
timeout, when torch fails the waiting ranks (thresholds.py). It never sets a verdict, and the
launcher never stops a job for it: the process group's timeout ends a wait that lasts too long.

The waits come from the events (a rank's open collective), and from the flight recorder's dumps
for ranks whose events show none: by default DDP's gradient all-reduce has no event (fr_wait).
"""

from __future__ import annotations

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, fmt_s
from ddpdoctor.monitor.judge.rules.fr_wait import fr_waits
from ddpdoctor.monitor.judge.rules.hang import members_of, progressing
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.snapshot import (
    CollectiveView,
    RankState,
    RankView,
    Snapshot,
    Thresholds,
    WaitView,
)
from ddpdoctor.monitor.model.views_together import waiting_collective
from ddpdoctor.rank_ranges import named_ranks

FINDING_ID = "wait.busy_rank"
MAX_WAITS = 16  # distinct waits listed (one per collective ranks wait in)
MAX_ON = 64  # ranks listed as waited on, per wait


def fix(th: Thresholds) -> str:
    timeout = fmt_s(th.pg_timeout_s)
    return (
        "Not a hang: the rank(s) waited on are working, and the others wait for them. If that "
        f"work can outlast the process group's timeout ({timeout}, {th.pg_timeout_basis}), "
        "torch will fail the waiting ranks: pass a longer one, "
        "`dist.init_process_group(..., timeout=datetime.timedelta(hours=2))`, or take the work "
        "off the critical path: download and unpack the data before `init_process_group` (or "
        "in a separate step), shard evaluation over every rank with a DistributedSampler, save "
        "checkpoints in the background (torch.distributed.checkpoint.async_save, or a thread)."
    )


def severity_of(waiting_s: float, th: Thresholds) -> Severity:
    if th.wait_error_after_s is not None and waiting_s >= th.wait_error_after_s:
        return Severity.ERROR
    if th.wait_warn_after_s is not None and waiting_s >= th.wait_warn_after_s:
        return Severity.WARNING
    return Severity.INFO


def current_waits(snap: Snapshot) -> list[tuple[list[RankView], list[RankView], CollectiveView]]:
    """(waiters, members behind them, the collective as the longest waiter sees it) per
    collective (group and sequence number) that ranks wait in past the waiting threshold,
    longest wait first: from the events, and from the flight recorder for ranks whose events
    show none (DDP's own gradient all-reduce: fr_wait)."""
    th = snap.thresholds
    if th is None:
        return []
    groups: dict[tuple[str, int], list[RankView]] = {}
    in_events: set[int] = set()
    waiting = RankState.WAITING  # (looked up once)
    for view in rank_index.of(snap).in_collective:
        if view.collective is None:
            continue
        coll = waiting_collective(view)
        if coll is not None and not view.state.finished:
            in_events.add(view.rank)
        if view.state is not waiting or coll is None:
            continue
        if view.heartbeat_age_s is not None and view.heartbeat_age_s > th.heartbeat_stale_s:
            continue  # its heartbeat stopped: not waiting, stalled (other rules speak for it)
        groups.setdefault((coll.group, coll.seq), []).append(view)
    out = []
    for (group, seq), waiters in groups.items():
        longest = max(waiters, key=lambda w: w.collective.waiting_s if w.collective else 0.0)
        coll = longest.collective
        assert coll is not None
        behind = [
            v
            for v in (snap.rank(m) for m in members_of(coll, snap))
            if v is not None and v.seq_in(group) < seq
        ]
        if behind:
            out.append((waiters, behind, coll))
    for found in fr_waits(snap, skip=frozenset(in_events)):
        out.append((list(found.waiters), list(found.behind), found.collective))
    out.sort(key=lambda triple: -triple[2].waiting_s)
    return out[:MAX_WAITS]


def detect(snap: Snapshot) -> RuleOutcome | None:
    th = snap.thresholds
    if th is None:
        return None
    waits: list[WaitView] = []
    findings: list[Finding] = []
    for waiters, behind, coll in current_waits(snap):
        busy = all(progressing(v) for v in behind)
        activity = next((v.activity for v in behind if v.activity is not None), None)
        timeout_in = None
        if th.pg_timeout_s is not None:
            timeout_in = max(0.0, th.pg_timeout_s - coll.waiting_s)
        severity = severity_of(coll.waiting_s, th) if busy else None
        verb = "waits" if len(waiters) == 1 else "wait"
        summary = (
            f"{named_ranks(w.rank for w in waiters)} {verb} {fmt_s(coll.waiting_s)} for "
            f"{named_ranks(v.rank for v in behind)}"
        )
        if activity is not None:
            summary += f", {activity.describe()}"
        wait = WaitView(
            waiters=tuple(w.rank for w in waiters),
            on=tuple(v.rank for v in behind[:MAX_ON]),
            collective=coll,
            waiting_s=coll.waiting_s,
            activity=activity,
            busy=busy,
            severity=severity.value if severity else None,
            timeout_s=th.pg_timeout_s,
            timeout_in_s=timeout_in,
            summary=summary,
        )
        waits.append(wait)
        if severity is not None:
            findings.append(_finding(wait, behind, severity, th))
    if not waits:
        return None
    return RuleOutcome(rule="wait", findings=tuple(findings), waits=tuple(waits))


def _finding(wait: WaitView, behind: list[RankView], severity: Severity, th: Thresholds) -> Finding:
    summary = f"{wait.summary} in {wait.collective.describe()}"
    if wait.timeout_in_s is not None:
        summary += f"; the process group times out in {fmt_s(wait.timeout_in_s)}"
    evidence = []
    for view in behind[:4]:
        if view.activity is None:
            continue
        line = f"rank {view.rank}: {view.activity.describe()} for {fmt_s(view.activity.since_s)}"
        if view.activity.frame and view.activity.frame != view.activity.where:
            line += f" (innermost frame {view.activity.frame})"
        if view.phase:
            line += f", phase {view.phase}"
        evidence.append(Evidence(line))
    evidence.append(
        Evidence(
            f"{named_ranks(wait.waiters)} in {wait.collective.describe()} for "
            f"{fmt_s(wait.waiting_s)}; a warning past {fmt_s(th.wait_warn_after_s)}, an error "
            f"past {fmt_s(th.wait_error_after_s)} of the {fmt_s(th.pg_timeout_s)} timeout"
        )
    )
    return Finding(
        id=FINDING_ID,
        severity=severity,
        summary=summary,
        fix=fix(th),
        ranks=tuple(sorted(wait.on)),
        evidence=tuple(evidence),
    )
