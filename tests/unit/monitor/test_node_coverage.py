"""No verdict before every node has spoken for the same time (ddpdoctor.monitor.judge.
node_coverage): a problem reached at T is shown as RUNNING until every other running node has
published two summaries since T, at most `wait_s`."""

from __future__ import annotations

from dataclasses import dataclass

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.judge.node_coverage import Coverage
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from ddpdoctor.protocol.node_records import NodeRecord
from tests.unit.monitor.test_monitor_builders import NOW, snap, view

NODES = {0: NodeRecord(0, "h1", 100, torchrun_pid=101), 1: NodeRecord(1, "h2", 200)}
WAIT = 6.0


@dataclass
class Seen:
    seq: int | None
    pid: int | None = 200
    changed_t: float | None = NOW


def mismatch():
    finding = Finding("uneven_inputs", Severity.ERROR, "rank 1 synced 150 times, rank 0 145", "")
    note = Finding("straggler", Severity.WARNING, "rank 1 is slower", "")
    return snap([view(0), view(1)], verdict=Verdict.MISMATCH, culprits=frozenset({1}),
                findings=(finding, note), confirmed=True)  # fmt: skip


def hold(cov, s, seen, now, nodes=NODES, polls=None):
    """A watcher that polled every half second since NOW (unless `polls` says otherwise)."""
    polls = int((now - NOW) * 2) if polls is None else polls
    silent = {  # as pipeline.seen.silences counts it: by the clock and in the watcher's polls
        n: min(now - x.changed_t, polls * 0.5) for n, x in seen.items() if x.changed_t is not None
    }
    return cov.hold(
        s, nodes, seen, silent, own_node=0, now=now, polls=polls, poll_s=0.5, wait_s=WAIT
    )


def test_a_verdict_waits_for_two_summaries_of_the_other_node_then_shows():
    cov = Coverage()
    s = mismatch()
    held = hold(cov, s, {1: Seen(10)}, NOW)
    assert held.verdict is Verdict.RUNNING and not held.culprits and not held.confirmed
    assert [f.id for f in held.findings] == ["straggler"]  # the problem's own finding waits
    assert hold(cov, s, {1: Seen(11, changed_t=NOW + 1)}, NOW + 1).verdict is Verdict.RUNNING
    assert hold(cov, s, {1: Seen(12, changed_t=NOW + 2)}, NOW + 2) is s


def test_a_flash_that_the_next_summaries_undo_is_never_shown():
    cov = Coverage()
    shown = [hold(cov, mismatch(), {1: Seen(10)}, NOW).verdict]
    healthy = snap([view(0), view(1)])  # node 1's next summary: the same count after all
    shown.append(hold(cov, healthy, {1: Seen(11, changed_t=NOW + 1)}, NOW + 1).verdict)
    assert Verdict.MISMATCH not in shown


def test_the_wait_is_bounded_and_a_silent_or_ended_node_is_not_waited_for():
    s = mismatch()
    cov = Coverage()
    hold(cov, s, {1: Seen(10)}, NOW)
    assert hold(cov, s, {1: Seen(10)}, NOW + WAIT) is s  # bounded
    cov = Coverage()
    hold(cov, s, {1: Seen(10)}, NOW)
    starved = hold(cov, s, {1: Seen(10)}, NOW + WAIT, polls=3)  # 3 polls in 6 s: a starved watcher
    assert starved.verdict is Verdict.RUNNING  # (the silence it saw is not long enough yet)
    cov = Coverage()
    hold(cov, s, {1: Seen(10, changed_t=NOW)}, NOW)
    assert hold(cov, s, {1: Seen(10, changed_t=NOW)}, NOW + WAIT - 1) is s  # silent: lost's
    ended = {**NODES, 1: NodeRecord(1, "h2", 200, ended_t=NOW)}
    cov = Coverage()
    assert hold(cov, s, {1: Seen(10)}, NOW, nodes=ended) is s


def test_new_culprits_wait_anew_and_a_restarted_launcher_counts_as_new():
    cov = Coverage()
    s = mismatch()
    hold(cov, s, {1: Seen(10)}, NOW)
    assert hold(cov, s, {1: Seen(1, pid=300)}, NOW + 0.5) is s
    other = snap([view(0), view(1)], verdict=Verdict.MISMATCH, culprits=frozenset({0}))
    assert hold(cov, other, {1: Seen(12)}, NOW + 1).verdict is Verdict.RUNNING


def test_one_node_and_no_problem_pass_untouched():
    cov = Coverage()
    healthy = snap([view(0), view(1)])
    assert hold(cov, healthy, {1: Seen(10)}, NOW) is healthy
    s = mismatch()
    assert hold(cov, s, {}, NOW) is s


def test_a_silence_counts_only_as_long_as_the_watcher_itself_polled():
    """A watcher starved of CPU (its polls seconds apart) does not take a node starved with it
    for a silent one: the silence it witnessed is at most half a second a poll."""
    from types import SimpleNamespace

    from ddpdoctor.monitor.pipeline.seen import silences

    feed = SimpleNamespace(seen={1: Seen(5, changed_t=NOW), 2: Seen(None, changed_t=None)})
    monitor = SimpleNamespace(_heard_at={}, polls=10, merge=SimpleNamespace(feed=feed))
    assert silences(monitor, NOW + 30, live=True) == {1: 0.0}  # one late poll: nothing seen
    monitor.polls = 14
    assert silences(monitor, NOW + 31, live=True) == {1: 2.0}
    assert silences(monitor, NOW + 31, live=False) == {1: 31.0}  # a record read later
    monitor.polls = 200
    assert silences(monitor, NOW + 32, live=True) == {1: 32.0}


def test_a_silent_node_is_waited_for_until_its_ranks_are_silent_too():
    """A host killed whole (lab: every process on h2 SIGKILLed): its last summary is a second
    older than its rank's last heartbeat, read from the rank's own file. The survivor's crash
    waits while the lost host cannot be named yet (its rank's heartbeat under LOST_AFTER_S
    old); once it can, node_ends tells it. Before, the crash of the survivor was let out in that
    second (seen once in the lab: "CRASH: culprit rank 0", then "culprit rank 1 (host h2 lost)")."""
    from ddpdoctor.monitor.judge.node_ends import LOST_AFTER_S, silent_with_their_ranks

    survivor_crash = snap(
        [view(0, RankState.FAILED, host="h1"), view(1, host="h2", heartbeat_age_s=4.5)],
        verdict=Verdict.CRASH,
        culprits=frozenset({0}),
        findings=(Finding("crash", Severity.ERROR, "rank 0 exited with code 1", ""),),
        confirmed=True,
    )
    node_of = {0: 0, 1: 1}
    quiet = silent_with_their_ranks(survivor_crash, {1: LOST_AFTER_S + 0.2}, node_of)
    assert quiet == {1: 4.5}  # not yet silent as a lost host's
    cov = Coverage()
    cov.hold(survivor_crash, NODES, {1: Seen(10)}, {1: 0.0}, own_node=0, now=NOW, polls=0,
             poll_s=0.5, wait_s=WAIT)  # fmt: skip
    held = cov.hold(survivor_crash, NODES, {1: Seen(10)}, quiet, own_node=0, now=NOW + 5.2,
                    polls=10, poll_s=0.5, wait_s=WAIT)  # fmt: skip
    assert held.verdict is Verdict.RUNNING and not held.culprits
    # the summaries' silence alone let it out (what was shown before)
    raw = {1: LOST_AFTER_S + 0.2}
    assert cov.hold(survivor_crash, NODES, {1: Seen(10)}, raw, own_node=0, now=NOW + 5.2,
                    polls=10, poll_s=0.5, wait_s=WAIT) is survivor_crash  # fmt: skip
    gone = snap([view(0, RankState.FAILED, host="h1"), view(1, RankState.GONE, host="h2")])
    assert silent_with_their_ranks(gone, {1: 5.2}, node_of) == {1: 5.2}
    never = snap([view(0), view(1, RankState.STARTING, host="h2", last_event=None)])
    assert silent_with_their_ranks(never, {1: 5.2, 2: 1.0}, node_of) == {1: 5.2, 2: 1.0}
