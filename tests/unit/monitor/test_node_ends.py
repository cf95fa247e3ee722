"""One story across nodes (ddpdoctor.monitor.judge.node_ends): how another node's part ended,
as its launcher's record and its silence tell it, on snapshots of a two-node job (rank 0 on h1,
node 0; rank 1 on h2, node 1)."""

from __future__ import annotations

import pytest

from ddpdoctor.monitor.judge.diagnose import apply_diagnosis, diagnose
from ddpdoctor.monitor.judge.node_ends import LOST_AFTER_S, across_nodes
from ddpdoctor.monitor.model.snapshot import RankState, Snapshot, Verdict
from ddpdoctor.protocol.node_records import (
    STOPPED_INTERRUPTED,
    STOPPED_LAUNCHER_KILLED,
    NodeRecord,
)
from tests.unit.monitor.test_monitor_builders import NOW, snap, view, waiting

RESET = "RuntimeError: [pair.cc:545] Read error [198.18.0.12]:4242: Connection reset by peer"
NODE_OF = {0: 0, 1: 1}


def nodes(**node1) -> dict[int, NodeRecord]:
    return {
        0: NodeRecord(0, "h1", 100, torchrun_pid=101),
        1: NodeRecord(1, "h2", 200, torchrun_pid=201, **node1),
    }


def judged(ranks) -> Snapshot:
    s = snap(ranks)
    return apply_diagnosis(s, diagnose(s), detected_after_s=None)


def survivor_reset() -> Snapshot:
    """rank 0 (h1) failed on a gloo reset; rank 1 (h2) silent since its last summary."""
    failed = view(0, RankState.FAILED, host="h1", error=RESET, exit_code=1, failed_t=NOW - 1)
    silent = view(1, RankState.STALLED, host="h2", heartbeat_age_s=8.0, alive=None)
    return judged([failed, silent])


def test_today_the_survivor_is_blamed():
    s = survivor_reset()
    assert s.verdict is Verdict.CRASH and s.culprits == {0}


def test_a_host_silent_with_its_ranks_is_lost_and_its_rank_the_culprit():
    s = across_nodes(survivor_reset(), nodes(), NODE_OF, {1: 9.0}, own_node=0)
    assert s.verdict is Verdict.CRASH and s.culprits == {1}
    lost = s.findings[0]
    assert lost.id == "node.lost" and lost.summary.startswith("host h2 lost: node 1's launcher")
    assert "last heard from at" in lost.summary and "(9 s ago)" in lost.summary
    (after,) = [f for f in s.findings if f.id == "crash.consequence"]
    assert after.ranks == (0,) and "the loss of h2" in after.summary


def test_not_lost_while_its_summaries_come_or_once_it_recorded_an_end():
    base = survivor_reset()
    assert across_nodes(base, nodes(), NODE_OF, {1: LOST_AFTER_S - 1}, own_node=0) is base
    ended = nodes(ended_t=NOW - 2)
    assert across_nodes(base, ended, NODE_OF, {1: 30.0}, own_node=0) is base


def test_a_launcher_silent_while_its_ranks_still_write_is_no_lost_host():
    failed = view(0, RankState.FAILED, host="h1", error=RESET, exit_code=1)
    writing = view(1, RankState.RUNNING, host="h2", heartbeat_age_s=0.5, alive=None)
    base = judged([failed, writing])
    assert across_nodes(base, nodes(), NODE_OF, {1: 30.0}, own_node=0) is base


def test_a_rank_that_raised_its_own_error_stays_the_culprit():
    own = view(0, RankState.FAILED, host="h1", error="ValueError: bad batch", exit_code=1)
    silent = view(1, RankState.STALLED, host="h2", heartbeat_age_s=8.0, alive=None)
    base = judged([own, silent])
    assert across_nodes(base, nodes(), NODE_OF, {1: 30.0}, own_node=0).culprits == {0}


def test_a_running_job_is_never_made_a_problem():
    base = judged([view(0, host="h1"), view(1, host="h2", heartbeat_age_s=9.0, alive=None)])
    assert base.verdict is Verdict.RUNNING
    assert across_nodes(base, nodes(), NODE_OF, {1: 30.0}, own_node=0) is base


def test_a_hang_with_no_culprit_and_a_silent_host_names_the_host():
    a = waiting(0, 50, 40.0, host="h1")
    b = waiting(1, 50, 40.0, host="h2", heartbeat_age_s=12.0, alive=None)
    base = snap([a, b], verdict=Verdict.HANG)
    s = across_nodes(base, nodes(), NODE_OF, {1: 12.0}, own_node=0)
    assert s.verdict is Verdict.HANG and s.culprits == {1} and s.findings[0].id == "node.lost"


def test_a_killed_launcher_is_named_and_the_job_interrupted_not_crashed():
    gone = view(1, RankState.FAILED, host="h2", exit_code=-15, exit_signal="SIGTERM", alive=None)
    failed = view(0, RankState.FAILED, host="h1", error=RESET, exit_code=1)
    base = judged([failed, gone])
    assert base.verdict is Verdict.CRASH and base.culprits  # a rank blamed, today
    killed = nodes(stopped_for=STOPPED_LAUNCHER_KILLED, ended_t=NOW)
    s = across_nodes(base, killed, NODE_OF, {}, own_node=0)
    assert s.verdict is Verdict.INTERRUPTED and not s.culprits
    first = s.findings[0]
    assert first.id == "node.launcher_killed" and "node 1's launcher" in first.summary
    assert "on h2, pid 200" in first.summary and first.ranks == (1,)
    assert not [f for f in s.findings if f.id in ("crash", "died", "crash.consequence")]


def test_ctrl_c_on_another_node_is_the_same_interruption_on_this_one():
    gone = view(1, RankState.FAILED, host="h2", exit_code=-2, exit_signal="SIGINT", alive=None)
    failed = view(0, RankState.FAILED, host="h1", error=RESET, exit_code=1)
    s = across_nodes(
        judged([failed, gone]), nodes(stopped_for=STOPPED_INTERRUPTED), NODE_OF, {}, own_node=0
    )
    assert s.verdict is Verdict.INTERRUPTED
    assert s.findings[0].id == "node.interrupted" and "on node 1 (h2)" in s.findings[0].summary


def test_a_problem_this_launcher_stopped_the_job_for_stands():
    base = survivor_reset()
    held = across_nodes(
        base, nodes(stopped_for=STOPPED_LAUNCHER_KILLED), NODE_OF, {}, own_node=0,
        held_problem=True,
    )  # fmt: skip
    assert held is base
    # ... but a crash it stopped the job for that only echoed a peer is the lost host's
    lost = across_nodes(base, nodes(), NODE_OF, {1: 17.0}, own_node=0, held_problem=True)
    assert lost.culprits == {1} and lost.findings[0].id == "node.lost"


def test_a_survivors_reset_waits_for_the_other_node_to_report_before_naming_a_culprit():
    from ddpdoctor.monitor.judge.node_ends import awaiting_nodes

    failed = view(0, RankState.FAILED, host="h1", error=RESET, exit_code=1, failed_t=NOW - 1)
    running = view(1, host="h2", alive=None)
    base = judged([failed, running])
    assert base.verdict is Verdict.CRASH and base.culprits == {0}  # the survivor, at once
    held = awaiting_nodes(base, nodes(), NODE_OF, {1: 0.5}, own_node=0, now=NOW)
    assert held.verdict is Verdict.RUNNING and not held.culprits and not held.confirmed
    assert held.findings[0].id == "node.awaited" and "node 1" in held.findings[0].summary
    # ... for a few seconds only, and not once node 1 has said one of its ranks failed
    late = NOW + LOST_AFTER_S + 1
    assert awaiting_nodes(base, nodes(), NODE_OF, {1: 0.5}, own_node=0, now=late) is base
    raised = view(1, RankState.FAILED, host="h2", error="ValueError: x", alive=None)
    told = judged([failed, raised])
    assert awaiting_nodes(told, nodes(), NODE_OF, {1: 0.5}, own_node=0, now=NOW) is told
    # a rank's own error is never held back
    own = judged(
        [view(0, RankState.FAILED, host="h1", error="ValueError: x", failed_t=NOW), running]
    )
    assert awaiting_nodes(own, nodes(), NODE_OF, {1: 0.5}, own_node=0, now=NOW) is own


def test_a_survivor_that_failed_after_the_host_went_silent_is_a_consequence_whatever_it_said():
    """A script that catches the reset and exits 1 (no error of its own to read), or raises
    its own error about the missing peer: it failed after h2 was last heard from."""
    silent = view(1, RankState.STALLED, host="h2", heartbeat_age_s=8.0, alive=None)
    for how in ({"exit_code": 1}, {"error": "ValueError: peer data missing", "exit_code": 1}):
        failed = view(0, RankState.FAILED, host="h1", failed_t=NOW - 5.5, **how)
        base = judged([failed, silent])
        assert base.verdict is Verdict.CRASH and base.culprits == {0}
        s = across_nodes(base, nodes(), NODE_OF, {1: 6.0}, own_node=0)
        assert s.culprits == {1} and s.findings[0].id == "node.lost", how
        (after,) = [f for f in s.findings if f.id == "crash.consequence"]
        assert after.ranks == (0,)


def test_a_survivor_that_failed_on_its_own_before_the_host_went_silent_stays_the_culprit():
    silent = view(1, RankState.STALLED, host="h2", heartbeat_age_s=8.0, alive=None)
    own = view(0, RankState.FAILED, host="h1", error="ValueError: bad batch", exit_code=1,
               failed_t=NOW - 20)  # fmt: skip
    base = judged([own, silent])
    assert across_nodes(base, nodes(), NODE_OF, {1: 6.0}, own_node=0).culprits == {0}


def starting(rank: int, host: str):
    from ddpdoctor.monitor.model.snapshot import RankView

    return RankView(rank=rank, state=RankState.STARTING, host=host)


def test_a_host_lost_while_the_job_starts_is_named_and_the_others_hang_on_it():
    from ddpdoctor.monitor.judge.node_ends import STARTUP_LOST_AFTER_S

    base = snap([starting(0, "h1"), starting(1, "h2")])
    assert base.verdict is Verdict.RUNNING
    early = across_nodes(base, nodes(), NODE_OF, {1: STARTUP_LOST_AFTER_S - 1}, own_node=0)
    assert early is base  # a launcher slow to publish while its ranks start is not lost
    s = across_nodes(base, nodes(), NODE_OF, {1: STARTUP_LOST_AFTER_S + 1}, own_node=0)
    assert s.verdict is Verdict.HANG and s.culprits == {1} and s.confirmed
    lost = s.findings[0]
    assert lost.id == "node.lost" and lost.summary.startswith("host h2 lost")
    assert "while the job was starting" in lost.summary
    # before any rank is known (still in torchrun's rendezvous): the host alone
    s = across_nodes(snap([]), nodes(), {}, {1: STARTUP_LOST_AFTER_S + 1}, own_node=0)
    assert s.verdict is Verdict.HANG and not s.culprits and "host h2 lost" in s.findings[0].summary


@pytest.mark.parametrize("state", [RankState.RUNNING, RankState.STALLED])
def test_a_rank_that_said_hello_but_never_joined_is_still_starting(state):
    """The runtime says hello as the rank starts, before init_process_group: h1's rank, alive
    and waiting there for h2's, has not joined; h2 silent past the start-up threshold is lost
    (it was read as a job past its start, and the job waited for torch's timeout). A rank that
    has waited there past the hang threshold shows stalled, and is starting still (the loss,
    once told, was dropped for 'running' at the next poll as the rank turned stalled, and the
    job was never stopped)."""
    from dataclasses import replace

    from ddpdoctor.monitor.judge.node_ends import STARTUP_LOST_AFTER_S

    hello = view(0, state, host="h1", last_event="hello", phase="init", step=0)
    base = snap([hello, starting(1, "h2")])
    s = across_nodes(base, nodes(), NODE_OF, {1: STARTUP_LOST_AFTER_S + 1}, own_node=0)
    assert s.verdict is Verdict.HANG and s.culprits == {1}, s.findings
    assert "while the job was starting" in s.findings[0].summary
    joined = snap([replace(hello, joined=True), starting(1, "h2")])
    assert across_nodes(joined, nodes(), NODE_OF, {1: 60.0}, own_node=0) is joined


def test_a_silent_node_while_ranks_train_is_not_a_startup_loss():
    base = judged([view(0, host="h1"), starting(1, "h2")])
    assert across_nodes(base, nodes(), NODE_OF, {1: 60.0}, own_node=0) is base
    ended = nodes(ended_t=NOW - 2)
    start = snap([starting(0, "h1"), starting(1, "h2")])
    assert across_nodes(start, ended, NODE_OF, {1: 60.0}, own_node=0) is start
