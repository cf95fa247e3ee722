"""recovery: a failure the job's launcher recovers from is a finding, never the end of the job.

A job run with a restart budget (torchrun's `--max-restarts`, read from each rank's
`TORCHELASTIC_MAX_RESTARTS`, ddpdoctor.monitor.model.attempts) survives a failure: its launcher
ends the attempt and starts the ranks again. While the failed attempt is not the last its budget
allows, and the run is live, the crash it shows is `run.restarting` (a warning: who failed
first, why and where) and the verdict stays `running`, so the launcher never stops a job that is
recovering. A problem whose culprits are processes of an earlier attempt than the latest (their
new process has not said hello yet) is the restart under way, not a problem of the run.

Once the job has run on, the earlier attempts are told: `run.recovered` beside a healthy verdict
(each failure's culprit, cause and line, the time and steps that attempt ran), or `run.attempts`
beside the crash of the last attempt a spent budget allows. A hang in any attempt is a hang.
The log explainers' errors of an attempt that failed (its traceback in torchrun's log, torchrun's
failure table) describe that attempt: beside a run that recovered they are warnings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, fmt_s
from ddpdoctor.monitor.judge.rules.crash import echoes_another
from ddpdoctor.monitor.model.attempt_views import Attempt, Attempts, RankEnding
from ddpdoctor.monitor.model.snapshot import RankState, Snapshot, Verdict

# The log explainers' families whose errors describe a failed rank (ddpdoctor.explain).
_FAILURE_FAMILIES = frozenset(
    {"python", "torchrun", "gloo", "nccl", "watchdog", "ddp", "ray", "fr"}
)
_UNSEEN = "its ranks failed before they joined a process group (their log says why)"
_FIX = (
    "Nothing stopped the job: its launcher restarts the ranks. Fix the failure above all the "
    "same (each restart repeats the work since the last checkpoint), and checkpoint often enough "
    "that a restart loses little."
)

# After a failure, the seconds until the next attempt's ranks are said to be slow to join: start-up
# (importing torch again, the rendezvous) takes seconds to a minute on a loaded machine.
RESTART_SLOW_S = 120.0
_RESTART_SLOW_FIX = (
    "If the new attempt's processes wait in init_process_group (a stack shows "
    "ProcessGroupGloo / connectFullMesh, or NCCL's init): torchrun's c10d rendezvous shares "
    "one TCPStore with the ranks and keeps it across restarts, so the next attempt may read "
    "the previous attempt's addresses and wait for peers that are gone, until the process "
    "group's timeout (30 min for gloo). Set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in "
    "torchrun's environment: each attempt's ranks then get a store of their own."
)


def first_failure(attempt: Attempt) -> RankEnding | None:
    """The failure that ended the attempt: the earliest that echoes no other (a peer's
    "Connection closed by peer", the launcher's SIGTERM of the survivors)."""
    failed = attempt.failures
    if not failed:
        return None
    return min(failed, key=lambda e: (echoes_another(e.cause, e.signal), e.t or 1e300))


def told_ending(ending: RankEnding) -> str:
    where = f" at {ending.line}" if ending.line else ""
    return f"rank {ending.rank}: {ending.cause}{where}"


def attempt_line(attempt: Attempt, total: int | None) -> str:
    of = f" of {total}" if total else ""
    first = first_failure(attempt)
    what = told_ending(first) if first is not None else _UNSEEN
    ran = [f"ran {fmt_s(attempt.duration_s)}"] if attempt.duration_s is not None else []
    if attempt.steps is not None:
        ran.append(f"reached step {attempt.steps}")
    return f"attempt {attempt.number + 1}{of} — {what}" + (f" ({', '.join(ran)})" if ran else "")


def _culprits(attempts: Attempts) -> tuple[int, ...]:
    firsts = (first_failure(a) for a in attempts.ended)
    return tuple(sorted({e.rank for e in firsts if e is not None}))


def _failed_before(attempts: Attempts) -> list[Attempt]:
    """The ended attempts: each failed (its launcher started the next). One with no ending
    ddpdoctor saw ended before its ranks said hello (in `init_process_group`)."""
    return list(attempts.ended)


def _restarting(snap: Snapshot, crash: RuleOutcome, attempts: Attempts) -> Finding:
    head = crash.findings[0] if crash.findings else None
    left = attempts.restarts_left
    restarts = f"{left} restart{'s' if left != 1 else ''} left" if left is not None else ""
    why = head.summary if head is not None else "a rank failed"
    summary = (
        f"{attempts.label()} failed — {why}; the launcher restarts the ranks ({restarts}): "
        "the job is recovering, not stopped"
    )
    fix = _FIX
    failed = [v.failed_t for v in snap.ranks if v.failed_t is not None and v.rank in crash.culprits]
    waited = snap.taken_t - min(failed) if failed else 0.0
    if waited >= RESTART_SLOW_S:
        # the next attempt's ranks have not said hello: they are starting, or they wait in
        # init_process_group (their runtime speaks once the group exists)
        summary += f"; {fmt_s(waited)} later no rank of the next attempt has joined a process group"
        fix = _RESTART_SLOW_FIX + " " + _FIX
    return Finding(
        "run.restarting",
        Severity.WARNING,
        summary,
        fix,
        tuple(sorted(crash.culprits)),
        head.evidence if head is not None else (),
    )


def _history(attempts: Attempts, *, recovered: bool) -> Finding | None:
    failed = _failed_before(attempts)
    if not failed:
        return None
    lines = "; ".join(attempt_line(a, attempts.total) for a in failed)
    n = len(failed)
    failures = f"{n} failure{'s' if n != 1 else ''}"
    if recovered:
        summary = f"recovered: the job ran on in {attempts.label()} after {failures}: {lines}"
        return Finding(
            "run.recovered", Severity.WARNING, summary, _FIX, _culprits(attempts), _evidence(failed)
        )
    summary = f"earlier attempts of this job failed too ({failures}): {lines}"
    return Finding(
        "run.attempts",
        Severity.WARNING,
        summary,
        "The last attempt's failure is the verdict; fix the earlier ones too if they differ.",
        _culprits(attempts),
        _evidence(failed),
    )


def _evidence(failed: Iterable[Attempt]) -> tuple[Evidence, ...]:
    out = []
    for attempt in failed:
        first = first_failure(attempt)
        what = told_ending(first) if first is not None else _UNSEEN
        out.append(Evidence(f"attempt {attempt.number + 1}: {what}"))
    return tuple(out)


def weigh(
    snap: Snapshot, primary: RuleOutcome | None, crash: RuleOutcome | None
) -> tuple[RuleOutcome | None, RuleOutcome | None, list[Finding]]:
    """(the outcome that sets the verdict, the crash outcome, the attempts' findings)."""
    attempts = snap.attempts
    if attempts is None:
        return primary, crash, []
    latest = attempts.current.number
    if primary is not None and primary.culprits and snap.live:
        culprits = primary.culprits
        behind = all(attempts.attempt_of(r) < latest for r in culprits)
        if primary.verdict is Verdict.CRASH and (
            behind or all(attempts.may_restart(r) for r in culprits)
        ):
            told_now = [] if behind else [_restarting(snap, primary, attempts)]
            history = _history(attempts, recovered=True)
            return None, None, [*told_now, *([history] if history else [])]
        if primary.verdict is Verdict.HANG and behind:
            history = _history(attempts, recovered=True)
            return None, None, [history] if history else []
    problem = primary is not None and primary.verdict is not None
    return primary, crash, told(snap, problem=problem)


def told(snap: Snapshot, *, problem: bool) -> list[Finding]:
    """The earlier attempts, beside the verdict (also one the launcher stopped the job for)."""
    if snap.attempts is None:
        return []
    history = _history(snap.attempts, recovered=not problem)
    return [history] if history else []


def restarting(snap: Snapshot) -> bool:
    """A rank of the latest attempt failed and the launcher may still restart the ranks: the
    next attempt is on its way (its processes have not said hello yet)."""
    attempts = snap.attempts
    if attempts is None or not snap.live:
        return False
    return any(
        v.state in (RankState.FAILED, RankState.GONE) and attempts.may_restart(v.rank)
        for v in snap.ranks
    )


def settle(findings: Iterable[Finding], snap: Snapshot, verdict: Verdict) -> list[Finding]:
    """The log explainers' errors about a failed attempt (its traceback in torchrun's log,
    torchrun's failure table), beside a run that went on, or goes on, without a problem:
    warnings of that attempt, never errors of a job that recovers."""
    attempts = snap.attempts
    if attempts is None or verdict.is_problem:
        return list(findings)
    if _failed_before(attempts):
        said = "in an attempt the job recovered from"
    elif restarting(snap):
        said = "in the attempt the launcher restarts"
    else:
        return list(findings)
    out = []
    for finding in findings:
        family = finding.id.split(".", 1)[0]
        if finding.severity is Severity.ERROR and family in _FAILURE_FAMILIES:
            finding = replace(
                finding, severity=Severity.WARNING, summary=f"{said}: {finding.summary}"
            )
        out.append(finding)
    return out
