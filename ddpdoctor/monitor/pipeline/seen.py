"""What ddpdoctor saw itself, as the Monitor (ddpdoctor.monitor.pipeline.live) applies it each poll:

- which ranks are processes of the job (ddpdoctor.monitor.follow.vouching): a rank of this host by
  its process, a rank of another host by its node's launcher;
- whether the ranks' events can be written at all (a full or read-only run directory), before the
  ranks are judged (ddpdoctor.monitor.model.rank_views.events_lost_state);
- how the other nodes' parts of a job ended (ddpdoctor.monitor.judge.node_ends), and, before the
  final word, time for them to say so.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import replace
from typing import Any

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.follow.liveness import is_local, pid_alive
from ddpdoctor.monitor.follow.vouching import PENDING, VOUCHED, holds_file
from ddpdoctor.monitor.judge.diagnose import Diagnosis
from ddpdoctor.monitor.judge.node_ends import (
    LOST_AFTER_S,
    across_nodes,
    awaiting_nodes,
    silent_with_their_ranks,
)
from ddpdoctor.monitor.judge.rules import RuleOutcome
from ddpdoctor.monitor.model.snapshot import Snapshot, Verdict
from ddpdoctor.rank_ranges import named_ranks

# A rank of another host is refused when its node's launcher has not counted it among its ranks
# this long after its hello was read here (a launcher publishes its ranks every second).
VOUCH_GRACE_S = 10.0


def across_nodes_of(monitor: Any, snap: Snapshot, now: float, *, final: bool = False) -> Snapshot:
    """How the other nodes' parts ended, as their launchers' records and the summaries
    that stopped coming tell it (ddpdoctor.monitor.judge.node_ends); before the final word, a
    problem is told only once the other nodes' summaries cover the time it was reached
    (ddpdoctor.monitor.judge.node_coverage)."""
    silent = silences(monitor, now, live=snap.live)
    held = monitor._held
    own_problem = bool(
        held is not None and held.rule != "stop" and held.verdict and held.verdict.is_problem
    )
    node_of = {view.rank: monitor.state.node_of(view.rank) for view in snap.ranks}
    told = across_nodes(
        snap, monitor.nodes, node_of, silent, own_node=monitor.node_rank, held_problem=own_problem
    )
    if told is snap and held is None and not monitor.job_ended and snap.live:
        told = awaiting_nodes(
            snap, monitor.nodes, node_of, silent, own_node=monitor.node_rank, now=now
        )
    if own_problem and told is not snap and told.findings[0].id == "node.lost":
        # the problem the job was stopped for was the lost host's: so says diagnosis.json's
        # stopped_for, which later watchers hold
        monitor._held = replace(held, culprits=told.culprits, findings=told.findings[:1])
    elif held is None and told.confirmed and told.verdict is not snap.verdict:
        # a host lost while the job started: the problem is node_ends' own, and the one a stop
        # for it holds (not a bare "stopped for a hang")
        monitor._confirmed[told.verdict] = RuleOutcome(
            rule="node_ends",
            verdict=told.verdict,
            culprits=told.culprits,
            findings=told.findings[:1],
            confirmed=True,
        )
    if final or monitor._held is not None or not snap.live:
        monitor.coverage.key = None
        return told
    if told.verdict.is_problem:  # a node stops being waited for once it can be named lost
        silent = silent_with_their_ranks(told, silent, node_of)
    return monitor.coverage.hold(
        told,
        monitor.nodes,
        monitor.merge.feed.seen,
        silent,
        own_node=monitor.node_rank,
        now=now,
        polls=monitor.polls,
        poll_s=POLL_S,
        wait_s=LOST_AFTER_S + 1.0,
    )


# A watcher polls every POLL_S (the launcher's loop, `watch`, the TUI's poller).
POLL_S = 0.5


def silences(monitor: Any, now: float, *, live: bool) -> dict[int, float]:
    """node -> how long its summaries have not changed. While the run is live, counted in this
    watcher's own polls too (at most POLL_S each): a watcher starved of CPU on a loaded machine,
    whose polls came seconds apart, cannot tell a silent node from one that was starved with it,
    so the silence it has witnessed is what counts."""
    silent: dict[int, float] = {}
    heard = monitor._heard_at
    for node, seen in monitor.merge.feed.seen.items():
        if seen.changed_t is None:
            continue
        mark = heard.get(node)
        if mark is None or mark[0] != seen.changed_t:
            mark = heard[node] = (seen.changed_t, monitor.polls)
        silent[node] = now - seen.changed_t
        if live:
            silent[node] = min(silent[node], (monitor.polls - mark[1]) * POLL_S)
    return silent


def await_nodes(monitor: Any) -> None:
    """Before the final word of a job over several nodes: give the other nodes' launchers
    time to record their end (a healthy job's do within a second or two), so that a node
    whose launcher is silent is known lost, not guessed. Bounded by LOST_AFTER_S."""
    if len(monitor.nodes) < 2 or monitor._held is not None:
        return  # (a launcher that stopped the job waited for its verdict before: no more)
    deadline = time.monotonic() + LOST_AFTER_S + 1.0
    while time.monotonic() < deadline:
        monitor.node_watch.due_now()
        snap = monitor._poll()
        pending = [
            node
            for node, record in monitor.nodes.items()
            if node != monitor.node_rank and not record.ended and record.stopped_for is None
        ]
        # as the lost host is told (node_ends): its summaries and its ranks' heartbeats silent
        # (a heartbeat read from a rank's file can be newer than its node's last summary, and
        # a host killed just before the survivor failed was otherwise judged a second early)
        node_of = {view.rank: monitor.state.node_of(view.rank) for view in snap.ranks}
        silent = silences(monitor, monitor.clock(), live=True)
        silent = silent_with_their_ranks(snap, silent, node_of)
        if all(silent.get(node, 0.0) >= LOST_AFTER_S for node in pending):
            return
        time.sleep(0.5)


def check_disk(monitor: Any, now: float, final: bool) -> None:
    """Whether the ranks' events can be written, before the ranks are judged: a rank seen
    gone without its exit event is looked at at once (was it the disk that kept it out?)."""
    ranks, alive = monitor.state.ranks, monitor.state.alive
    steps = [t.step for t in ranks.values() if t.step is not None]
    vanished = any(alive.get(r) is False and t.exit_code is None for r, t in ranks.items())
    monitor.disk.check(now, max(steps, default=None), force=final or vanished)
    monitor.state.set_events_lost(monitor.disk.events_lost)


def vouch(monitor: Any) -> None:
    """Vouch for the ranks of this host while the job runs here: a launcher of the run
    (until its job has ended), or a watcher that sees one of the run's ranks alive here."""
    launcher = launcher_pids(monitor)
    if monitor.job_ended or not (os.getpid() in launcher or True in monitor.state.alive.values()):
        return
    here = monitor._local_hosts
    monitor.vouching.look(
        monitor.state,
        lambda host: here.get(host) or is_local(host, monitor.local_host),
        roots=launcher,
        remote=functools.partial(vouched_by_node, monitor) if len(monitor.nodes) > 1 else None,
    )


def doubt_exits(monitor: Any) -> None:
    """An exit line of a rank of this host whose process still runs and still holds its event
    file open: the runtime writes its exit last and closes the file at once, so that line is
    someone else's (appended to the file) or a stale one. The rank is not ended while so
    (its exit is doubted); once seen so at two polls, the line is contradicted: dropped, and
    reported. A process that ends, or closes the file, leaves the line to stand."""
    if monitor.job_ended:
        return
    here = monitor._local_hosts
    state = monitor.state
    for rank, tracker in state.ranks.items():
        if tracker.exit_code is None or tracker.pid is None or state.alive.get(rank) is False:
            continue
        if tracker.exit_code == 0 and tracker.error_t is None:
            continue  # a clean end stops nothing
        if not (here.get(tracker.host) or is_local(tracker.host, monitor.local_host)):
            continue
        if not pid_alive(tracker.pid, tracker.hello_t):
            state.set_alive(rank, False)  # ended: its exit line stands (looked at no more)
            runs = False
        else:
            runs = holds_file(tracker.pid, monitor.vouching.events_file(rank))
        if runs and tracker.exit_doubted:
            tracker.exit_contradicted("its process runs on, its event file still open")
        elif runs != tracker.exit_doubted:
            tracker.exit_doubted = runs
        else:
            continue
        tracker.version += 1
        state._remake.add(rank)


def contradicted_findings(state: Any) -> list[Finding]:
    """Exit and error lines a rank's own process contradicted, and calls and heartbeats
    numbered out of its own order (ddpdoctor.monitor.model.rank_tracker, call_events.dispute,
    own_lines.own_beat)."""
    ranks = sorted(state.ranks.items())
    said = [(r, t.contradicted) for r, t in ranks if t.contradicted]
    calls = [
        (r, t.disputed + (f" and {t.disputed_calls - 1} more" if t.disputed_calls > 1 else ""))
        for r, t in ranks
        if t.disputed
    ]
    beats = [
        (r, t.beats_disputed + (f", {t.disputed_beats} in all" if t.disputed_beats > 1 else ""))
        for r, t in ranks
        if t.beats_disputed
    ]
    found = [
        _not_its_own(
            "run.forged_exit", said, "{ranks} not ended: an exit or error line in {its} events "
            "is contradicted by the process itself ({lines})",
            "A rank's runtime writes its exit event last, and its heartbeats count the errors it "
            "wrote. A line appended to a rank's event file by something else (or left from "
            "another run) is reported, never acted on.",
        ),
        _not_its_own(
            "run.forged_calls", calls, "{ranks}: collective lines in {its} events that its own "
            "process did not number so ({lines}); those calls are not compared",
            "A rank's runtime numbers the calls of each group one after another. A collective "
            "line appended to a rank's event file by something else (or left from another run) "
            "is reported, never acted on.",
        ),
        _not_its_own(
            "run.forged_beats", beats, "{ranks}: heartbeats in {its} events that its own process "
            "did not number so ({lines}); they decide nothing from then on",
            "A rank's runtime numbers its heartbeats one after another. Heartbeats appended to a "
            "rank's event file by something else are reported; the rank is judged blocked only "
            "where ddpdoctor sees its process idle itself, an error line stands once its "
            "process is gone.",
        ),
    ]  # fmt: skip
    return [f for f in found if f is not None]


def _not_its_own(
    finding_id: str, said: list[tuple[int, str]], summary: str, fix: str
) -> Finding | None:
    """One warning for the ranks whose lines of one kind their own process contradicted."""
    if not said:
        return None
    lines = "; ".join(f"rank {rank}: {what}" for rank, what in said[:8])
    its = "its" if len(said) == 1 else "their"
    text = summary.format(ranks=named_ranks(r for r, _ in said), its=its, lines=lines)
    return Finding(finding_id, Severity.WARNING, text, fix)


def vouched_by_node(monitor: Any, rank: int, tracker: Any) -> str:
    """A rank of another host, in a job whose launchers ddpdoctor started on every node: its
    parent must be a node's torchrun (host and pid, that node's record), and that node's
    launcher must count it among its ranks (its summary) within VOUCH_GRACE_S of its hello
    being read here."""
    records = monitor.nodes
    if len(records) < (monitor.state.info.nnodes or 0) or any(
        r.torchrun_pid is None for r in records.values()
    ):
        return PENDING  # not every launcher has recorded its torchrun yet
    node = next(
        (n for n, r in records.items() if (r.host, r.torchrun_pid) == (tracker.host, tracker.ppid)),
        None,
    )
    if node is None:
        return (
            f"its parent (pid {tracker.ppid} on {tracker.host}) is no node's torchrun: no "
            "launcher of the job started it"
        )
    seen = monitor.merge.feed.seen.get(node)
    if seen is not None and rank in seen.ranks:
        return VOUCHED
    first = monitor._pending_since.setdefault(rank, monitor.clock())
    if seen is not None and monitor.clock() - first > VOUCH_GRACE_S:
        return f"node {node}'s launcher ({records[node].host}) does not count it among its ranks"
    return PENDING


def look_vouched(monitor: Any, look: Any) -> bool:
    """A node's network look (network.json) may confirm a stop only when it is the look this
    launcher took itself (held in memory, never the file's). Another node's look is a file any
    process of the job can write, with any host and number in it: it explains the hang, it
    stops nothing (a cut link between this host and another shows in this host's own look)."""
    return look.node_rank == monitor.node_rank and bool(monitor.network.own(look))


def launcher_pids(monitor: Any) -> set[int]:
    """The pids of the run's launchers on this host (run.json's, the node records')."""
    pids = {r.launcher_pid for r in monitor.nodes.values() if is_local(r.host, monitor.local_host)}
    pid = monitor._launcher_pid
    if pid is None:
        data = monitor.run.read_run_json()
        found, hosts = data.get("launcher_pid"), data.get("hosts")
        host = hosts[0] if isinstance(hosts, list) and hosts else None
        local = isinstance(host, str) and is_local(host, monitor.local_host)
        pid = monitor._launcher_pid = found if type(found) is int and local else 0
    return {p for p in (*pids, pid) if isinstance(p, int) and p > 0}


def undisputed(diagnosis: Diagnosis, merge: Any) -> Diagnosis:
    """A verdict that rests on a disputed node's rows is told, never acted on: a mismatch (the
    calls another node's rows name may be a rewritten summary's), or culprits that ranks of such
    a node are (ddpdoctor.monitor.follow.row_claims). The final verdict reads every rank's own
    events, rows of no node."""
    disputed = merge.claims.disputed
    if not diagnosis.confirmed or not disputed:
        return diagnosis
    ranks = {rank for rank, node in merge.via.items() if node in disputed}
    if ranks and (diagnosis.verdict is Verdict.MISMATCH or diagnosis.culprits & ranks):
        return replace(diagnosis, confirmed=False)
    return diagnosis
