"""p2p: who waits for whom through point-to-point calls, followed to the rank that waits for
nobody (pipeline stages, hand-written send/recv).

A rank blocked in send/recv/isend/irecv/batch_isend_irecv waits for its peer(s), not for the
world: collective sequence numbers say nothing here. The wait-for graph has an edge from each
rank that has waited in a point-to-point call past the hang threshold (heartbeat alive) to its
peers, and from a rank waiting in a collective to the members that have not reached it. The
rule follows the edges from each waiting rank:

- to a rank in no call that is not making progress (blocked, silent or of unknown activity):
  a hang; that rank is the culprit, named with the line it is stuck at (its heartbeat's user
  frame, its stack), the waiting chain as evidence. A busy rank is a wait, never a hang. As in
  the collective hang rule, a culprit blocked for the whole wait (rules.hang.blocked_through)
  makes it a hang past the sooner threshold (hang_blocked_after_s); any other takes the full one;
- back to a rank already on the path: a deadlock (two ranks each receiving from the other, a
  send whose receive is never posted while the receiver went on to a collective): a mismatch
  naming both calls and their lines;
- to a rank that ended cleanly: a send or receive whose counterpart was never posted, a
  mismatch naming the waiting call and its line.

The two mismatches keep the full hang threshold: the sooner one's evidence is a culprit in no
call that has not moved for the whole wait, and a rank waiting in a call is blocked by being
there, which says nothing about whether its wait will end.
"""

from __future__ import annotations

from dataclasses import replace

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, confirmed_mismatch, fmt_s
from ddpdoctor.monitor.judge.rules.crash import looks_like_consequence
from ddpdoctor.monitor.judge.rules.describe import stack_of, where_is
from ddpdoctor.monitor.judge.rules.hang import (
    blocked_through,
    heartbeat_alive_while_waiting,
    members_of,
    progressing,
    soonest_after,
    undecided,
)
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.snapshot import (
    POINT_TO_POINT_OPS,
    CollectiveView,
    RankState,
    RankView,
    Snapshot,
    Verdict,
)

MAX_CHAIN = 64  # ranks followed from one waiter (a pipeline is rarely deeper)

HANG_FIX = (
    "A pipeline stage (or a rank of a send/recv exchange) stopped answering its neighbours: "
    "look at what it does at the line named (a blocking call, a lock, a dead DataLoader "
    "worker, a sleep). Its neighbours wait in their send/recv until the process group's "
    "timeout (NCCL 10 min, gloo 30 min)."
)
DEADLOCK_FIX = (
    "Every send needs the matching receive on its peer, posted in an order that cannot block "
    "both sides: pair each rank's sends and receives (post them together with "
    "dist.batch_isend_irecv, or let one rank send first and the other receive first), give "
    "every rank the same number of microbatches and steps, and keep collectives out of a "
    "send/recv exchange that only some ranks run."
)


def p2p_call(view: RankView) -> CollectiveView | None:
    coll = view.collective
    if coll is None or view.state.finished or coll.op not in POINT_TO_POINT_OPS:
        return None
    return coll


def _file_function(frame: str) -> tuple[str, str]:
    """("job.py", "main") of "job.py:72 main" (or of a path)."""
    place, _, function = frame.partition(" ")
    file = place.rpartition(":")[0].replace("\\", "/").rpartition("/")[2]
    # a call's site names the qualified function ("Trainer.train"), a heartbeat its code name
    return file, function.rpartition(".")[2]


def moved_on(view: RankView, coll: CollectiveView) -> bool:
    """An async send or receive still open while the rank's own code runs in another function
    than the one that posted it (a stage computing, or stalled, in its forward while an
    earlier isend waits for the neighbour): the rank is not waiting in it."""
    if coll.op not in ("isend", "irecv", "batch_isend_irecv") or coll.site is None:
        return False
    where = view.activity.where if view.activity is not None else None
    if not where or not coll.site.user:
        return False
    return _file_function(where) != _file_function(coll.site.user)


def _site(coll: CollectiveView) -> str:
    return f" at {coll.site.user}" if coll.site is not None and coll.site.user else ""


def _call_text(view: RankView, coll: CollectiveView) -> str:
    peers = ",".join(map(str, coll.peers)) or "?"
    word = "from" if coll.op in ("recv", "irecv") else "with" if "batch" in coll.op else "to"
    return f"rank {view.rank} waits in {coll.op} #{coll.seq} {word} rank {peers}{_site(coll)}"


def _edges(view: RankView, snap: Snapshot, long_wait: bool) -> tuple[int, ...] | None:
    """The ranks `view` waits for (None: it waits for nobody). `long_wait`: only a wait past
    the sooner threshold counts (the rank a chain starts from); whether a wait under the full
    one is a hang is for the rank found at the chain's end to say (_follow)."""
    th = snap.thresholds
    assert th is not None
    coll = view.collective
    if coll is None or view.state.finished:
        return None
    if long_wait and (
        coll.waiting_s < soonest_after(th) or not heartbeat_alive_while_waiting(view, coll, snap)
    ):
        return None
    if coll.op in POINT_TO_POINT_OPS:
        return None if moved_on(view, coll) else coll.peers or None
    behind = tuple(
        m
        for m in members_of(coll, snap)
        if m != view.rank
        and (peer := snap.rank(m)) is not None
        and peer.seq_in(coll.group) < coll.seq
    )
    return behind or None


def _evidence_at(view: RankView, what: str) -> Evidence:
    """Where the rank stands, with its file and line when its heartbeat named its frame."""
    where = view.activity.where if view.activity is not None else None
    if where:
        place = where.partition(" ")[0]
        file, _, line = place.rpartition(":")
        if file and line.isdigit():
            return Evidence(f"rank {view.rank} {what} at {where}", file, int(line))
    return Evidence(f"rank {view.rank} {what}")


def _hang(snap: Snapshot, chain: list[RankView], culprit: RankView, after: float) -> RuleOutcome:
    """The hang of `culprit`, which the chain waits for; `after`: the threshold the start's
    wait passed (the sooner one when the culprit was blocked for all of it)."""
    th = snap.thresholds
    assert th is not None
    first = chain[0]
    first_call = first.collective
    assert first_call is not None
    since = first_call.since_t
    onset = since + after if since is not None else snap.taken_t
    stage = f" (pipeline {culprit.pipeline.stage_text()})" if culprit.pipeline else ""
    position = ""
    if culprit.pipeline is not None and culprit.pipeline.step is not None:
        position = f" at {culprit.pipeline.position()}"
    summary = (
        f"rank {culprit.rank}{stage} stopped answering its neighbours{position}: "
        f"{_call_text(first, first_call)} for {fmt_s(first_call.waiting_s)}; "
        f"{where_is(culprit, snap.stacks)}"
    )
    if culprit.activity is not None:
        summary += f"; {culprit.activity.describe()}"
    evidence = [_evidence_at(culprit, "is stuck")]
    group = stack_of(culprit.rank, snap.stacks)
    if group is not None:
        frames = [f for f in group.frames if f][-6:]
        evidence.append(Evidence(f"rank {culprit.rank} stack: " + " > ".join(frames)))
    for view in chain[:8]:
        coll = view.collective
        if coll is None:
            continue
        threshold = ""
        if view is first:  # the wait the hang is declared on: which threshold it passed
            sooner = f", rank {culprit.rank} blocked" if after < th.hang_after_s else ""
            threshold = f" (threshold {fmt_s(after)}{sooner}; heartbeat alive)"
        evidence.append(
            Evidence(
                f"{_call_text(view, coll)} for {fmt_s(coll.waiting_s)}{threshold}",
                coll.site.file or None if coll.site else None,
                coll.site.line if coll.site else None,
            )
        )
    progress = culprit.last_progress_t
    started = min(progress, since) if progress is not None and since is not None else since
    finding = Finding(
        id="hang",
        severity=Severity.ERROR,
        summary=summary,
        fix=HANG_FIX,
        ranks=(culprit.rank,),
        evidence=tuple(evidence),
    )
    return RuleOutcome(
        rule="p2p",
        findings=(finding,),
        verdict=Verdict.HANG,
        culprits=frozenset({culprit.rank}),
        started_t=started,
        onset_t=onset,
        stalled=frozenset({culprit.rank})
        if culprit.state is not RankState.WAITING
        else frozenset(),
        waiting_on=tuple((v.rank, (culprit.rank,)) for v in chain),
        confirmed=True,
    )


def _deadlock(snap: Snapshot, cycle: list[RankView], ended: RankView | None) -> RuleOutcome:
    parts = []
    evidence = []
    for view in cycle:
        coll = view.collective
        if coll is None:
            continue
        text = (
            _call_text(view, coll)
            if coll.op in POINT_TO_POINT_OPS
            else f"rank {view.rank} waits in {coll.describe()}{_site(coll)}"
        )
        parts.append(text)
        site = coll.site
        evidence.append(
            Evidence(text, site.file or None if site else None, site.line if site else None)
        )
    if ended is not None:
        summary = (
            f"point-to-point call without its counterpart: {parts[0]}, but rank {ended.rank} "
            f"ended cleanly without the matching call"
        )
        ranks = tuple(sorted({cycle[0].rank, ended.rank}))
    else:
        summary = "point-to-point deadlock: " + "; ".join(parts[:4])
        ranks = tuple(sorted(v.rank for v in cycle))
    finding = Finding(
        id="p2p.deadlock",
        severity=Severity.ERROR,
        summary=summary,
        fix=DEADLOCK_FIX,
        ranks=ranks,
        evidence=tuple(evidence),
    )
    th = snap.thresholds
    assert th is not None
    since = [v.collective.since_t for v in cycle if v.collective and v.collective.since_t]
    onset = max(since) + th.hang_after_s if since else snap.taken_t
    return confirmed_mismatch("p2p", finding, onset)


def unmatched_at_end(snap: Snapshot) -> RuleOutcome | None:
    """A rank that failed on its peers' going away ("Connection closed by peer") while in a
    send or receive with peers that had all ended cleanly: the call its peers never made (one
    stage ran fewer steps or microbatches), a mismatch, not a crash of the rank left waiting."""
    failed = RankState.FAILED  # (looked up once)
    for view in rank_index.of(snap).unsettled:
        coll = view.collective
        if (
            view.state is not failed
            or coll is None
            or coll.op not in POINT_TO_POINT_OPS
            or not coll.peers
            or not looks_like_consequence(view)
        ):
            continue
        peers = [snap.rank(p) for p in coll.peers]
        if not peers or any(p is None or p.state is not RankState.DONE for p in peers):
            continue
        outcome = _deadlock(snap, [view], peers[0])
        onset = view.failed_t if view.failed_t is not None else outcome.onset_t
        return replace(outcome, started_t=onset, onset_t=onset)
    return None


def detect(snap: Snapshot) -> RuleOutcome | None:
    """The earliest hang or deadlock found by following the waits from a long P2P waiter, or
    a send or receive left without its counterpart when the peers ended."""
    if snap.thresholds is None:
        return None
    ended = unmatched_at_end(snap)
    if ended is not None:
        return ended
    best: RuleOutcome | None = None
    for start in rank_index.of(snap).in_collective:  # (a waiter has a call open)
        if p2p_call(start) is None or _edges(start, snap, long_wait=True) is None:
            continue
        outcome = _follow(snap, start)
        if outcome is not None and (best is None or (outcome.onset_t or 0) < (best.onset_t or 0)):
            best = outcome
    return best


def _follow(snap: Snapshot, start: RankView) -> RuleOutcome | None:
    th = snap.thresholds
    assert th is not None and start.collective is not None
    start_wait = start.collective.waiting_s
    # under the full threshold (past the sooner one: _edges) only a blocked culprit speaks
    full = start_wait >= th.hang_after_s
    chain = [start]
    on_path = {start.rank: 0}
    view = start
    for _ in range(MAX_CHAIN):
        peers = _edges(view, snap, long_wait=view is start)
        if not peers:
            return None
        nxt = None
        for peer in peers:
            other = snap.rank(peer)
            if other is None:
                continue
            if peer in on_path:
                cycle = chain[on_path[peer] :]
                # a cycle through a collective only: the collective rules speak for it
                if any(p2p_call(v) is not None for v in cycle) and len(cycle) > 1:
                    return _deadlock(snap, cycle, None) if full else None
                return None
            if other.state is RankState.DONE:
                if view is start:
                    return _deadlock(snap, [view], other) if full else None
                continue
            if other.state.finished:
                return None  # it failed or vanished: the crash rule names it
            if _edges(other, snap, long_wait=False) is not None:
                nxt = other
                continue
            if progressing(other) or undecided(other, snap):
                return None  # busy in its own code: the others wait for it, not a hang
            if full:
                return _hang(snap, chain, other, th.hang_after_s)
            if not blocked_through(other, start_wait, snap):
                return None  # it moved during the wait, or cannot tell: the full threshold decides
            return _hang(snap, chain, other, soonest_after(th))
        if nxt is None:
            return None
        on_path[nxt.rank] = len(chain)
        chain.append(nxt)
        view = nxt
    return None
