"""One story across nodes: how another node's part of the job ended, told as what it was.

A job that spans nodes ends on every node when one node's part ends, and each node's ranks then
fail in their own way (a gloo peer resets the connection, torchrun stops the rest with SIGTERM).
Read rank by rank, that is a crash of whichever rank failed first, often a survivor. What the
launchers saw themselves says what happened (their node records, ddpdoctor.protocol.node_records,
and whether their summaries still come):

    interrupted      a node's `ddpdoctor run` got Ctrl-C or a stop signal: the job was stopped
                     by a user on that node (INTERRUPTED on every node)
    launcher_killed  a node's `ddpdoctor run` was killed (SIGKILL, the OOM killer): its job guard
                     ended that node's ranks (INTERRUPTED, as on one node)
    lost host        a node whose launcher has not ended and whose summaries stopped coming at
                     once with its ranks: the host went down, was cut off or had every process
                     killed. A crash or hang found meanwhile is that host's: its ranks are the
                     culprits, the other hosts' failures the consequences, whoever saw the
                     connection close first and whatever its script then said (a survivor that
                     failed after the lost host was last heard from failed because of it).
                     While the job is still starting (its ranks in the rendezvous or in
                     init_process_group, nothing failed), a node silent STARTUP_LOST_AFTER_S is
                     lost too: a HANG of the other nodes' ranks, which would wait for it until
                     their timeout.

These only re-tell a problem or a stop that the records show; they never make one of a job that
runs well (a node whose summaries are late while every rank progresses is `node.stale` only).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.judge.node_coverage import not_told_yet
from ddpdoctor.monitor.judge.rules.crash import consequences, looks_like_consequence, root_cause
from ddpdoctor.monitor.model.snapshot import RankState, Snapshot, Verdict
from ddpdoctor.protocol.node_records import (
    STOPPED_INTERRUPTED,
    STOPPED_LAUNCHER_KILLED,
    NodeRecord,
)
from ddpdoctor.rank_ranges import named_ranks

INTERRUPTED = STOPPED_INTERRUPTED  # NodeRecord.stopped_for of a launcher the user stopped
LAUNCHER_KILLED = STOPPED_LAUNCHER_KILLED  # ... of one that was killed (its reaper wrote it)
# A node silent this long (no new summary, by the watcher's clock), its launcher not ended: lost.
LOST_AFTER_S = 5.0
# ... while the job is still starting (no failure to explain, nothing else to go by; a launcher
# busy starting its ranks on a loaded machine may miss a few seconds): longer.
STARTUP_LOST_AFTER_S = 20.0
# A summary is composed up to this long before a watcher sees it change (published every
# second, read at the next half-second poll): a node last heard from at T was lost after T - this.
SUMMARY_LAG_S = 1.5
NODE_ENDS = frozenset({"node.interrupted", "node.launcher_killed", "node.lost"})
# Findings that only describe how the ranks were ended by the stop or the loss.
_STOP_EFFECTS = frozenset({"crash", "died", "crash.consequence", "torchrun.signal", "run.stopped"})
_FAILED = frozenset({RankState.FAILED, RankState.GONE})
# How a rank that has not joined a process group yet shows (importing, preparing, waiting in
# init_process_group: stalled once it has waited there past the hang threshold).
_START_STATES = frozenset({RankState.STARTING, RankState.RUNNING, RankState.STALLED})


def across_nodes(
    snap: Snapshot,
    nodes: Mapping[int, NodeRecord],
    node_of: Mapping[int, int | None],
    silent_s: Mapping[int, float],
    *,
    own_node: int | None,
    held_problem: bool = False,
) -> Snapshot:
    """The snapshot as the other nodes' ends tell it. `node_of`: rank -> its node; `silent_s`:
    node -> seconds since its summary last changed (nodes whose summaries were read);
    `held_problem`: this launcher stopped the job for a problem of its own finding (a later
    stop on another node does not undo it; a lost host may still be that problem's cause)."""
    others = {n: r for n, r in nodes.items() if n != own_node}
    if not others or any(f.id in NODE_ENDS for f in snap.findings):
        return snap  # (told already: the launcher's final word, which a watcher holds)
    for why in (INTERRUPTED, LAUNCHER_KILLED):
        stopped = sorted(n for n, r in others.items() if r.stopped_for == why)
        if stopped and not held_problem:
            return _stopped_on(snap, others[stopped[0]], why, node_of)
    if snap.verdict is Verdict.RUNNING and snap.live and _starting(snap):
        lost = _silent_nodes(snap, others, node_of, silent_s, STARTUP_LOST_AFTER_S)
        if lost:
            return _lost(snap, [others[n] for n in lost], node_of, silent_s, starting=True)
    if snap.verdict not in (Verdict.CRASH, Verdict.HANG):
        return snap
    lost = _silent_nodes(snap, others, node_of, silent_s, LOST_AFTER_S)
    if not lost or not _theirs(snap, set(lost), node_of, silent_s):
        return snap
    return _lost(snap, [others[n] for n in lost], node_of, silent_s)


def _silent_nodes(
    snap: Snapshot,
    others: Mapping[int, NodeRecord],
    node_of: Mapping[int, int | None],
    silent_s: Mapping[int, float],
    after_s: float,
) -> list[int]:
    """The nodes whose launcher has not ended and whose summaries stopped coming `after_s`
    ago, together with their ranks' events."""
    return sorted(
        n
        for n, r in others.items()
        if not r.ended
        and r.stopped_for is None
        and silent_s.get(n, 0.0) >= after_s
        and _ranks_silent(snap, _ranks_of(n, node_of))
    )


def _starting(snap: Snapshot) -> bool:
    """The job is still starting: no rank has joined a process group (they are in torchrun's
    rendezvous, importing, or in init_process_group, which a rank leaves only once every rank
    is there; a rank's runtime says hello before it joins) and none has failed. A rank that
    waited there past the hang threshold shows stalled, and is still starting: it waits for
    the lost host's ranks (read as past its start, the loss went unnamed a second after it was
    told, and the job waited for torch's timeout)."""
    return all(not v.joined and not v.step and v.state in _START_STATES for v in snap.ranks)


def _theirs(
    snap: Snapshot,
    lost: set[int],
    node_of: Mapping[int, int | None],
    silent_s: Mapping[int, float],
) -> bool:
    """Whether the problem found can be the lost nodes': a crash whose first failure only
    echoes a peer's (a connection reset), is a rank of theirs, or came after they were last
    heard from (whatever the survivor said: its script may catch the reset and exit 1, or
    raise an error of its own about the missing data); a hang with no culprit, or only
    theirs. A rank of a live node that failed on its own before the loss stays the culprit."""
    if snap.verdict is Verdict.CRASH:
        root = root_cause(snap)
        if root is None or looks_like_consequence(root) or node_of.get(root.rank) in lost:
            return True
        heard = min(snap.taken_t - silent_s.get(n, 0.0) for n in lost)
        return root.failed_t is not None and root.failed_t >= heard - SUMMARY_LAG_S
    return all(node_of.get(rank) in lost for rank in snap.culprits)


def _ranks_silent(snap: Snapshot, ranks: list[int]) -> bool:
    """The node's ranks went silent with their launcher (a launcher alone that stops
    publishing, while its ranks still write, is `node.stale`, not a lost host)."""
    views = [v for v in snap.ranks if v.rank in set(ranks)]
    return all(
        v.state is RankState.GONE
        or (v.state is RankState.STARTING and v.last_event is None)  # (never said anything)
        or (v.heartbeat_age_s is not None and v.heartbeat_age_s >= LOST_AFTER_S)
        for v in views
    )


def silent_with_their_ranks(
    snap: Snapshot, silent_s: Mapping[int, float], node_of: Mapping[int, int | None]
) -> dict[int, float]:
    """node -> its silence as a lost host's: its summaries' silence, but no longer than its
    ranks' own (a rank's heartbeat read from its file can be newer than the node's last
    summary); a rank gone, or never heard from, is silent for good. This is what `across_nodes`
    waits for before it names the host lost (`_silent_nodes`), so a verdict held back for that
    node's word (node_coverage) is let out no sooner than the lost host can be told."""
    quiet = dict(silent_s)
    for view in snap.ranks:  # (one pass over the ranks: there may be thousands of nodes)
        node = node_of.get(view.rank)
        if node not in quiet or view.state is RankState.GONE:
            continue
        if view.state is RankState.STARTING and view.last_event is None:
            continue
        age = view.heartbeat_age_s if view.heartbeat_age_s is not None else 0.0
        if age < quiet[node]:
            quiet[node] = age
    return quiet


def _ranks_of(node: int, node_of: Mapping[int, int | None]) -> list[int]:
    return sorted(rank for rank, n in node_of.items() if n == node)


def _launcher(record: NodeRecord) -> str:
    return f"node {record.node_rank}'s launcher (ddpdoctor run on {record.host}, pid {record.launcher_pid})"


def _stopped_on(
    snap: Snapshot, record: NodeRecord, why: str, node_of: Mapping[int, int | None]
) -> Snapshot:
    ranks = _ranks_of(record.node_rank, node_of)
    theirs = f" ({named_ranks(ranks)})" if ranks else ""
    if why == INTERRUPTED:
        finding = Finding(
            "node.interrupted",
            Severity.INFO,
            f"the job was interrupted on node {record.node_rank} ({record.host}): its ddpdoctor "
            f"run (pid {record.launcher_pid}) got Ctrl-C or a stop signal and stopped that "
            f"node's ranks{theirs}; every other node stopped its part with it",
            "Nothing to fix: rerun to let the job finish.",
        )
    else:
        finding = Finding(
            "node.launcher_killed",
            Severity.WARNING,
            f"{_launcher(record)} was killed (SIGKILL: a user, the OOM killer, a closed "
            f"session) while the job ran; its job guard then ended that node's ranks{theirs}, "
            "and the other nodes' ranks failed as a consequence",
            f"Nothing to fix in the job: find what killed ddpdoctor on {record.host} "
            "(`journalctl -k` for the OOM killer), and rerun.",
            ranks=tuple(ranks),
        )
    # (how the ranks were ended by the stop, torchrun's report of the first of them included)
    kept = tuple(
        f
        for f in snap.findings
        if f.id not in _STOP_EFFECTS and f.id not in ("node.stale", "torchrun.failed")
    )
    return replace(
        snap,
        verdict=Verdict.INTERRUPTED,
        findings=(finding, *kept),
        culprits=frozenset(),
        detected_after_s=None,
        confirmed=False,
    )


def _lost(
    snap: Snapshot,
    records: list[NodeRecord],
    node_of: Mapping[int, int | None],
    silent_s: Mapping[int, float],
    *,
    starting: bool = False,
) -> Snapshot:
    lost_ranks: list[int] = []
    lines = []
    for record in records:
        ranks = _ranks_of(record.node_rank, node_of)
        lost_ranks += ranks
        silent = silent_s.get(record.node_rank, 0.0)
        heard = time.strftime("%H:%M:%S", time.localtime(time.time() - silent))
        lines.append(
            f"host {record.host} lost: {_launcher(record)} and its "
            f"{named_ranks(ranks) if ranks else 'ranks'} went silent at once, last heard from "
            f"at {heard} ({silent:.0f} s ago), and its launcher never recorded an end"
        )
    hosts = ", ".join(sorted({r.host for r in records}))
    why = ": the host went down, was cut off from the others, or had every process killed"
    if starting:
        why += (
            ", while the job was starting: the other hosts' ranks wait for it in the "
            "rendezvous or in init_process_group, and would until their timeout"
        )
    finding = Finding(
        "node.lost",
        Severity.ERROR,
        "; ".join(lines) + why,
        f"See what happened to {hosts} (is it up? `ping`, the scheduler's node state, its "
        "system log: an OOM or a reboot); the other hosts' failures follow from it.",
        ranks=tuple(lost_ranks),
    )
    if starting:  # nothing failed yet: every other rank waits for the lost host, for ever
        silent = max(silent_s.get(r.node_rank, 0.0) for r in records)
        return replace(
            snap,
            verdict=Verdict.HANG,
            findings=(finding, *snap.findings),
            culprits=frozenset(lost_ranks),
            confirmed=True,
            detected_after_s=silent,
        )
    survivors = [v for v in snap.ranks if v.state in _FAILED and v.rank not in set(lost_ranks)]
    findings: list[Finding] = [finding]
    if survivors:
        findings.append(consequences(survivors, None, after=f"the loss of {hosts}"))
    kept = tuple(f for f in snap.findings if f.id not in _STOP_EFFECTS)
    return replace(
        snap,
        findings=(*findings, *kept),
        culprits=frozenset(lost_ranks),
    )


def awaiting_nodes(
    snap: Snapshot,
    nodes: Mapping[int, NodeRecord],
    node_of: Mapping[int, int | None],
    silent_s: Mapping[int, float],
    *,
    own_node: int | None,
    now: float,
) -> Snapshot:
    """While a job over several nodes runs: a crash whose first failure only echoes a peer's
    (a connection reset) while another node has not said yet how its part is doing is not
    told for LOST_AFTER_S (+1 s) after that failure: that node's summary says within a second
    which of its ranks failed first, or its silence says that it is lost. Until then the
    verdict stays RUNNING, so that no view, and no stop, names the survivor."""
    if snap.verdict is not Verdict.CRASH:
        return snap
    root = root_cause(snap)
    if root is None or not looks_like_consequence(root) or root.failed_t is None:
        return snap
    if not 0 <= now - root.failed_t < LOST_AFTER_S + 1.0:
        return snap
    failed_nodes = {node_of.get(v.rank) for v in snap.ranks if v.state in _FAILED}
    waiting = sorted(
        n
        for n, r in nodes.items()
        if n != own_node
        and not r.ended
        and r.stopped_for is None
        and silent_s.get(n, 0.0) < LOST_AFTER_S
        and n not in failed_nodes
    )
    if not waiting:
        return snap
    note = Finding(
        "node.awaited",
        Severity.INFO,
        f"rank {root.rank} failed on a peer's error ({root.error or root.exit_signal}); "
        f"waiting for {', '.join(f'node {n}' for n in waiting)} to report before naming a "
        "culprit",
        "Nothing to do: the verdict follows within seconds.",
    )
    return not_told_yet(snap, (note, *(f for f in snap.findings if f.id not in _STOP_EFFECTS)))
