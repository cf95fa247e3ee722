"""torchft: a replica group that dies and heals is recovery, not a fault.

torchft is built to outlive a replica group: the others train on without it, its own torchrun
starts it again, and its new process heals from a peer group at the next quorum. So, in a run
whose ranks are torchft's (their hello says their replica group):

- While the run is live (a rank runs or wrote lately, or a launcher has a process that has not
  joined yet: a restart importing torch), a rank that failed is *recovering*: it is taken out of
  the crash rule's sight (no crash verdict, nothing to stop the job for) and reported as a
  warning, `torchft.replica_failed`, with its signal or error and what goes on without it.
- A rank whose earlier process failed and that came back in a new process is *recovered*: a
  warning, `torchft.replica_recovered`, names the replica group, how the old process ended
  (signal, exception and line), its step, and the heal of the new one (from which group, at
  which step). The verdict stays what the ranks' current processes make it: healthy when they
  finish.
- Once the run is over, a rank that failed and never came back is a crash as in any job: its
  torchrun ran out of restarts.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome
from ddpdoctor.monitor.model.replica_groups import ReplicaEnding, TorchftView
from ddpdoctor.monitor.model.snapshot import RankState, RankView, Snapshot
from ddpdoctor.rank_ranges import named_ranks

_ENDED_BADLY = frozenset({RankState.FAILED, RankState.GONE})
FIX_FAILED = (
    "Nothing to do while it recovers: torchft trains on with the other replica groups and the "
    "group's torchrun (--max-restarts) starts it again. If it does not come back, its torchrun "
    "ran out of restarts: look at why it ended (its signal or traceback)."
)
FIX_RECOVERED = (
    "The job recovered by itself. If replicas die often, look at why (the signal: the host's "
    "OOM killer or a scheduler; the traceback of an exception): each death costs the steps the "
    "group spends restarting and healing."
)


def still_recovering(snap: Snapshot) -> bool:
    """The run may still recover: it is live, or a launcher has a process that has not joined
    (a restarted replica importing torch)."""
    return snap.live or any(launcher.not_joined for launcher in snap.launchers)


def recovering(snap: Snapshot) -> frozenset[int]:
    """The failed ranks of a torchft run that it may still recover from."""
    tf = snap.torchft
    if tf is None or not still_recovering(snap):
        return frozenset()
    return frozenset(
        v.rank for v in snap.ranks if v.state in _ENDED_BADLY and tf.group_of(v.rank) is not None
    )


def without(snap: Snapshot, ranks: frozenset[int]) -> Snapshot:
    """The snapshot as the other rules judge it: the recovering ranks out of sight."""
    if not ranks:
        return snap
    return replace(snap, ranks=tuple(v for v in snap.ranks if v.rank not in ranks))


def detect(snap: Snapshot, excused: frozenset[int]) -> RuleOutcome | None:
    """The warnings of the replicas that failed and recover, or recovered."""
    tf = snap.torchft
    if tf is None:
        return None
    findings = [_failed(v, tf, snap) for v in snap.ranks if v.rank in excused]
    for ending in tf.endings:
        if ending.failed:
            findings.append(_recovered(ending, tf))
    if not findings:
        return None
    return RuleOutcome(rule="torchft", findings=tuple(findings))


def _group(tf: TorchftView, rank: int) -> str:
    group = tf.group_of(rank)
    return f"replica group {group}" if group is not None else "its replica group"


def _after(steps: int | None) -> str:
    """The steps of the process that failed (ddpdoctor counts them per process; torchft's own
    step count goes on across the group's processes)."""
    if not steps:
        return ""
    return f" after {steps} step{'s' if steps != 1 else ''} of its process"


def _how(view: RankView) -> str:
    if view.error:
        return view.error + (f" at {view.error_line}" if view.error_line else "")
    if view.exit_signal:
        return f"killed by {view.exit_signal}"
    if view.exit_code not in (None, 0):
        return f"exit code {view.exit_code}"
    return "its process ended without an exit event"


def _failed(view: RankView, tf: TorchftView, snap: Snapshot) -> Finding:
    others = sorted({g for r, g in tf.groups if r != view.rank and g != tf.group_of(view.rank)})
    going_on = [v.rank for v in snap.ranks if v.rank != view.rank and not v.state.finished]
    summary = f"rank {view.rank} ({_group(tf, view.rank)}) failed{_after(view.step)}: {_how(view)}"
    if going_on and others:
        summary += (
            f"; torchft goes on with replica group{'s' if len(others) > 1 else ''} "
            f"{', '.join(map(str, others))} ({named_ranks(going_on)} running)"
        )
    summary += "; its torchrun may start it again"
    return Finding(
        "torchft.replica_failed",
        Severity.WARNING,
        summary,
        FIX_FAILED,
        ranks=(view.rank,),
        evidence=tuple(
            Evidence(line.text, line.file, line.line_no) for line in view.error_lines[:4]
        ),
    )


def _recovered(ending: ReplicaEnding, tf: TorchftView) -> Finding:
    summary = (
        f"rank {ending.rank} ({_group(tf, ending.rank)}) failed{_after(ending.step)}: "
        f"{ending.cause}; "
        "it came back in a new process"
    )
    heal = tf.heal_after(ending.rank, ending.t)
    if heal is not None:
        source = f" from replica group {heal.from_group}" if heal.from_group is not None else ""
        at = f" at torchft step {heal.step}" if heal.step is not None else ""
        summary += f" and healed{source}{at}" if heal.done else f" and began to heal{source}{at}"
    evidence = [Evidence(f"pid {ending.pid}: {ending.cause}")] if ending.pid else []
    return Finding(
        "torchft.replica_recovered",
        Severity.WARNING,
        summary,
        FIX_RECOVERED,
        ranks=(ending.rank,),
        evidence=tuple(evidence),
    )


_PID = re.compile(r"\(pid:? (\d{1,10})\)")
# What the job's logs say of a peer's death (a consequence torchft handles: it reports the error
# to its manager and drops the step)
_PEER_LOST = frozenset({"gloo.peer_closed", "gloo.connection_reset", "crash.consequence"})
# torchft's own machinery, as the logs name it: a frame of its package, its quorum store's keys.
# A replica group's death makes the others' torchft code raise and wait inside it (an
# AssertionError "process group not initialized" in Manager.allreduce, a 10 s wait for store
# keys under /torchft/), which torchft handles: the step is not committed.
_TORCHFT_INTERNAL = re.compile(r"(?:site|dist)-packages/torchft/|store keys \(/torchft/")
_INTERNAL_IDS = frozenset({"python.exception", "c10d.store_wait_timeout"})


def weigh(findings: list[Finding], snap: Snapshot, excused: frozenset[int]) -> list[Finding]:
    """The log explainers' findings of a torchft run that recovers: torchrun's report of a
    replica's death, and the peers' lost connections, are information (the warnings above say
    what happened); the rest stands."""
    tf = snap.torchft
    if tf is None or not (excused or any(e.failed for e in tf.endings)):
        return findings
    pids = {e.pid: e.rank for e in tf.endings if e.pid is not None}
    pids.update({v.pid: v.rank for v in snap.ranks if v.rank in excused and v.pid is not None})
    # the exceptions the replicas that recover raised, by type ("AssertionError")
    raised = {e.error.split(":")[0] for e in tf.endings if e.failed and e.error}
    raised |= {v.error.split(":")[0] for v in snap.ranks if v.rank in excused and v.error}
    weighed = []
    for finding in findings:
        if finding.severity is not Severity.INFO:
            match = _PID.search(finding.summary)
            rank = pids.get(int(match.group(1))) if match else None
            if finding.id.startswith("torchrun.") and rank is not None:
                finding = replace(
                    finding,
                    severity=Severity.INFO,
                    summary=f"torchrun's report, of rank {rank} ({_group(tf, rank)}): "
                    f"{finding.summary} — torchft went on without it (torchft.replica_*)",
                    ranks=(rank,),
                )
            elif finding.id == "python.exception" and any(
                f"raised {name}" in finding.summary for name in raised
            ):
                finding = replace(
                    finding,
                    severity=Severity.INFO,
                    summary=f"{finding.summary} — a replica that torchft recovered "
                    "(torchft.replica_*)",
                )
            elif finding.id in _INTERNAL_IDS and _TORCHFT_INTERNAL.search(finding.summary):
                finding = replace(
                    finding,
                    severity=Severity.INFO,
                    summary=f"{finding.summary} — inside torchft, as a replica group died and "
                    "came back (torchft.replica_*)",
                )
            elif finding.id in _PEER_LOST:
                finding = replace(
                    finding,
                    severity=Severity.INFO,
                    summary=f"{finding.summary} — a replica group's death, which torchft "
                    "handled (the step was not committed)",
                )
        weighed.append(finding)
    return weighed
