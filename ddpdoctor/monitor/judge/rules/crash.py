"""crash: the first rank to fail is the root cause; later failures are its consequences (F41).

Order comes from event times, not from torchrun's failure table (which names the exit the agent
noticed first, often a victim). Errors that only echo another rank's failure — a connection reset
or closed by peer, NCCL's "remote process exiting", watchdog teardown, torchrun's SIGTERM — never
win over a real error.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, call_sites, fmt_s
from ddpdoctor.monitor.judge.rules import died as died_rule
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.snapshot import RankState, RankView, Snapshot, Verdict
from ddpdoctor.rank_ranges import named_ranks

_CONSEQUENCE = re.compile(
    r"Connection (reset|closed) by peer|Broken pipe|remote process exit|ncclRemoteError|"
    r"communicator was aborted|NCCL communicator|taking the entire process down|"
    r"Socket Timeout|Connection refused|ProcessGroup.*abort|watchdog|"
    r"recvBytes|SIGTERM|closing signal",
    re.IGNORECASE,
)
EXTERNAL_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")
_EXTERNAL_SIGNALS = EXTERNAL_SIGNALS
TRACEBACK_LINES = 6
# A root cause whose error says a peer went away ("Connection closed by peer") while that peer
# still runs: its end (a clean exit after fewer collectives, a crash of its own) is usually a
# few hundred milliseconds behind. The verdict waits this long for it before it is held.
PEER_FATE_WAIT_S = 3.0
# ... and longer while that peer's process is still seen alive: on a busy machine its clean exit
# (or the launcher's stop) can take many seconds to land, and the verdict must not depend on
# which comes first (a DDP job whose ranks sync a different number of times read as a crash).
PEER_ALIVE_WAIT_S = 30.0


_ENDED_BADLY = frozenset({RankState.FAILED, RankState.GONE})


def failures(snap: Snapshot) -> list[RankView]:
    return [v for v in rank_index.of(snap).unsettled if v.state in _ENDED_BADLY]


def looks_like_consequence(view: RankView) -> bool:
    """The rank's failure only echoes someone else's (or an outside stop)."""
    if view.exit_reason == "signal":
        return True
    return echoes_another(view.error, view.exit_signal)


def echoes_another(error: str | None, signal: str | None) -> bool:
    """An error or end that only echoes someone else's failure (or an outside stop)."""
    if signal in _EXTERNAL_SIGNALS:
        return True
    return bool(error and _CONSEQUENCE.search(error))


def root_cause(snap: Snapshot) -> RankView | None:
    failed = failures(snap)
    if not failed:
        return None
    return min(
        failed,
        key=lambda v: (looks_like_consequence(v), v.failed_t if v.failed_t is not None else 1e300),
    )


def detect(snap: Snapshot) -> RuleOutcome | None:
    root = root_cause(snap)
    if root is None:
        return None
    same = [
        v
        for v in failures(snap)
        if v.rank != root.rank
        and v.state is RankState.FAILED
        and v.error
        and v.error == root.error
        and not looks_like_consequence(v)
    ]
    culprits = [root.rank] + [v.rank for v in same]
    others = [v for v in failures(snap) if v.rank not in culprits]
    findings = [_with_extra_call(root_finding(root, same), root, snap)]
    if others:
        findings.append(consequences(others, root))
    return RuleOutcome(
        rule="crash",
        findings=tuple(findings),
        verdict=Verdict.CRASH,
        confirmed=not _awaiting_peers_fate(root, snap),
        culprits=frozenset(culprits),
        started_t=root.failed_t,
        onset_t=root.failed_t,
    )


def _awaiting_peers_fate(root: RankView, snap: Snapshot) -> bool:
    """The root's own error blames a peer that has not ended yet, for under PEER_FATE_WAIT_S."""
    if not (root.error and _CONSEQUENCE.search(root.error)) or root.failed_t is None:
        return False
    running = [v for v in snap.ranks if v.rank != root.rank and not v.state.finished]
    age = snap.taken_t - root.failed_t
    if not running or age >= PEER_ALIVE_WAIT_S:
        return False
    return age < PEER_FATE_WAIT_S or any(v.alive for v in running)


def _with_extra_call(finding: Finding, root: RankView, snap: Snapshot) -> Finding:
    """A root cause that failed only because its peers went away (`Connection closed by peer`)
    while it waited in a collective that those peers, which ended cleanly, never made from its
    call site (`if rank == 0: strategy.barrier()` at the end): that extra call is the cause."""
    if root.collective is None or not looks_like_consequence(root):
        return finding
    ended = [v for v in snap.ranks if v.rank != root.rank and v.state is RankState.DONE]
    divergence = call_sites.ended_divergence([root], root.collective, ended)
    if divergence is None:
        return finding
    summary = f"{divergence.describe()}; rank {root.rank} then failed: {root.error}"
    return replace(finding, summary=summary, evidence=divergence.evidence() + finding.evidence)


def root_finding(root: RankView, same: list[RankView]) -> Finding:
    if root.state is RankState.GONE:
        return died_rule.finding(root)
    where = []
    if root.phase:
        where.append(f"phase {root.phase}")
    if root.step is not None:
        where.append(f"step {root.step}")
    place = f" (in {', '.join(where)})" if where else ""
    if root.error:
        summary = f"rank {root.rank} failed first{place}: {root.error}"
        if root.error_line:  # the user's line it raised at (the error event's location)
            summary += f" at {root.error_line}"
    elif root.exit_signal:
        summary = f"rank {root.rank} failed first{place}: ended by {root.exit_signal}"
    else:
        summary = f"rank {root.rank} failed first{place}: exited with code {root.exit_code}"
    if same:
        summary += f" ({named_ranks(v.rank for v in same)} failed with the same error)"
    evidence: list[Evidence] = []
    file, line = root.error_at if root.error_at else (None, None)
    if root.error:
        evidence.append(Evidence(f"rank {root.rank}: {root.error}", file, line))
    if root.traceback:
        evidence.extend(Evidence(text) for text in traceback_tail(root.traceback))
    for log in root.error_lines:
        if len(evidence) >= 12:
            break
        evidence.append(Evidence(log.text, log.file, log.line_no))
    fix = (
        f"Fix the error on rank {root.rank} first (its traceback is above): it is the root cause; "
        "errors on the other ranks (connection reset or closed by peer, watchdog timeouts, "
        "torchrun's SIGTERM) follow from it."
    )
    if root.exit_signal in _EXTERNAL_SIGNALS:
        fix = (
            f"Rank {root.rank} was stopped from outside ({root.exit_signal}); if nobody meant to stop "
            "the job, look for what sent the signal (scheduler time limit, preemption, a user)."
        )
    return Finding(
        id="crash",
        severity=Severity.ERROR,
        summary=summary,
        fix=fix,
        ranks=tuple(sorted([root.rank] + [v.rank for v in same])),
        evidence=tuple(evidence),
    )


def traceback_tail(traceback: str, frames: int = 2) -> list[str]:
    """The innermost `frames` frames of a Python traceback (file line + code line), without the
    ^^^ markers, and the exception line: where the error was raised."""
    lines = [
        ln.rstrip()
        for ln in traceback.rstrip().splitlines()
        if ln.strip() and set(ln.strip()) - set("^~")
    ]
    starts = [i for i, ln in enumerate(lines) if ln.lstrip().startswith('File "')]
    if not starts:
        return lines[-TRACEBACK_LINES:]
    first = starts[-frames] if len(starts) >= frames else starts[0]
    return lines[first:][-TRACEBACK_LINES * 2 :]


def consequences(
    others: list[RankView], cause: RankView | None, *, after: str | None = None
) -> Finding:
    """One finding listing the failures that followed the root cause (or a hang)."""
    evidence = []
    for view in sorted(others, key=lambda v: v.failed_t or 0)[:16]:
        what = view.error or (
            f"ended by {view.exit_signal}"
            if view.exit_signal
            else f"exit code {view.exit_code}"
            if view.exit_code is not None
            else "vanished"
        )
        delay = ""
        if cause is not None and view.failed_t is not None and cause.failed_t is not None:
            delay = f" ({fmt_s(max(0.0, view.failed_t - cause.failed_t))} after rank {cause.rank})"
        evidence.append(Evidence(f"rank {view.rank}: {what}{delay}"))
    reason = after or (f"rank {cause.rank}'s failure" if cause is not None else "the first failure")
    return Finding(
        id="crash.consequence",
        severity=Severity.INFO,
        summary=f"{named_ranks(v.rank for v in others)} failed as a consequence of {reason}",
        fix="Nothing to fix on these ranks: they stopped because of the problem above.",
        ranks=tuple(sorted(v.rank for v in others)),
        evidence=tuple(evidence),
    )
