"""A job over two nodes read the hierarchical way: node 0's monitor follows node 1's rank through
node 1's summary (its file paused), diagnoses the same hang, and goes back to the file, with a
finding, once the summaries stop."""

from __future__ import annotations

import json

from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.follow.node_publisher import RankDigest
from ddpdoctor.monitor.follow.node_summaries import STALE_AFTER_S, STALE_FINDING_S
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from ddpdoctor.protocol.node_records import NodeRecord, write_node_record
from ddpdoctor.protocol.node_summary import read_node_summary
from ddpdoctor.protocol.rundir import RunDir
from tests.unit.monitor.test_monitor_monitor import Clock, Writer, hang, train, wait

TORCHRUN = 4_190_000  # no process of this host: no /proc answer for it
KW = {"capture_stacks": False, "explain_logs": False, "write_diagnosis": False}


def two_nodes(tmp_path):
    run = RunDir.create(tmp_path / "run")
    run.run_json.write_text(json.dumps({"world_size": 2, "nnodes": 2, "backend": "gloo"}))
    for node, host in ((0, "nodeA"), (1, "nodeB")):
        record = NodeRecord(node, host, 10 + node, torchrun_pid=TORCHRUN + node, nproc=1)
        write_node_record(run, record)
    clock = Clock()
    w = Writer(run, clock)
    for rank, host in ((0, "nodeA"), (1, "nodeB")):
        w.ev(
            rank,
            "hello",
            local_rank=0,
            world_size=2,
            host=host,
            pid=5000 + rank,
            ppid=TORCHRUN + rank,
        )
        w.ev(rank, "phase", phase="train")
    return run, clock, w


def tail_offset(monitor: Monitor, rank: int) -> int:
    return monitor.tailer._events[str(monitor.run.events_file(rank))][0].offset


def test_node_0_follows_node_1_through_its_summary_and_finds_the_hang(tmp_path):
    run, clock, w = two_nodes(tmp_path)
    seq = train(w, clock, 8)
    follower = Monitor(run, node_rank=1, clock=clock, **KW)
    lead = Monitor(run, node_rank=0, clock=clock, **KW)
    follower.poll()
    summary = read_node_summary(run, 1)
    assert summary is not None and summary.all_ranks() == (1,)
    assert lead.poll().ranks[1].step == 8
    assert lead.merge.via == {1: 1}  # rank 1 is followed through node 1's summary
    paused_at = tail_offset(lead, 1)
    seq = train(w, clock, 8, seq)
    clock.t += 1.0
    follower.poll()
    assert follower.merge.held == {0} and not follower.merge.active  # its own rank only
    held_at = tail_offset(follower, 0)
    snap = lead.poll()
    assert snap.ranks[1].step == 16 and snap.ranks[1].state is RankState.RUNNING
    assert tail_offset(lead, 1) == paused_at  # its file was not read again
    follower.poll()
    assert tail_offset(follower, 0) == held_at
    fault_t = hang(w, clock, seq + 1, 3.0)
    for _ in range(10):  # (+ two of node 1's summaries after the verdict: node_coverage)
        wait(w, clock, seq + 1, fault_t, 0.5)
        follower.poll()
        snap = lead.poll()
    assert snap.verdict is Verdict.HANG and snap.culprits == {1}
    assert snap.ranks[0].waiting_on == (1,)
    assert tail_offset(lead, 1) == paused_at
    # node 1's rank stopped progressing: node 1 pulled node 0's summary, and sees the same
    assert follower.merge.active and follower.merge.via == {0: 0}
    # (the call rank 0 is in counts once node 0's next summary bears it out: row_claims)
    for _ in range(8):  # (+ node 0's two summaries after the verdict: node_coverage)
        wait(w, clock, seq + 1, fault_t, 0.5)
        lead.poll()
        seen_by_follower = follower.poll()
    assert seen_by_follower.verdict is Verdict.HANG and seen_by_follower.culprits == {1}
    assert not [f for f in snap.findings if f.id == "node.stale"]
    # node 1's launcher stops publishing: its rank is read from its file again, then named
    wait(w, clock, seq + 1, fault_t, STALE_AFTER_S + 0.5)
    snap = lead.poll()
    assert lead.merge.via == {} and tail_offset(lead, 1) > paused_at
    assert snap.verdict is Verdict.HANG and snap.culprits == {1}
    assert snap.ranks[1].step == seq  # the whole file read again: the same state
    wait(w, clock, seq + 1, fault_t, STALE_FINDING_S - STALE_AFTER_S)
    stale = [f for f in lead.poll().findings if f.id == "node.stale"]
    assert len(stale) == 1 and "node 1's launcher (nodeB, pid 11) stopped reporting" in (
        stale[0].summary
    )


def test_a_follower_someone_watches_shows_every_node_through_the_summaries(tmp_path):
    """A follower launcher with a TUI or a live terminal view: node 0's rank shows as node 0's
    summary says, all along (not as never heard of), and its file stays unread there."""
    run, clock, w = two_nodes(tmp_path)
    seq = train(w, clock, 6)
    lead = Monitor(run, node_rank=0, clock=clock, **KW)
    watched = Monitor(run, node_rank=1, clock=clock, follow_all_nodes=True, **KW)
    unwatched = Monitor(run, node_rank=1, clock=clock, **KW)
    lead.poll()
    clock.t += 1.0
    for monitor in (watched, unwatched):
        monitor.poll()
    train(w, clock, 4, seq)
    clock.t += 1.0
    lead.poll()
    snap = watched.poll()
    assert watched.merge.active and watched.merge.via == {0: 0}
    assert snap.ranks[0].state is RankState.RUNNING and snap.ranks[0].step == 10
    assert snap.ranks[1].step == 10 and snap.verdict is Verdict.RUNNING
    # (the rank's file was paused when the summary took over: only its hello was read)
    assert tail_offset(watched, 0) < tail_offset(lead, 0)
    quiet = unwatched.poll()
    assert not unwatched.merge.active and quiet.ranks[0].state is RankState.STARTING


def test_the_final_word_reads_every_file_once(tmp_path):
    run, clock, w = two_nodes(tmp_path)
    train(w, clock, 5)
    follower = Monitor(run, node_rank=1, clock=clock, **KW)
    lead = Monitor(run, node_rank=0, clock=clock, **KW)
    follower.poll()
    lead.poll()
    assert lead.merge.via == {1: 1}
    for rank in (0, 1):
        w.ev(rank, "exit", code=0, reason="normal")
    final = lead.close(job_ended=True)
    assert lead.merge.via == {} and final.verdict is Verdict.HEALTHY
    assert [v.step for v in final.ranks] == [5, 5]


def test_a_digest_keeps_the_state_not_the_history():
    digest = RankDigest()
    line = 0
    for seq in range(1, 30):
        for kind in ("collective_start", "collective_end", "step"):
            line += 1
            digest.note(line, {"rank": 0, "kind": kind, "seq": seq, "step": seq, "group": "g"})
    line += 1
    digest.note(line, {"rank": 0, "kind": "collective_start", "seq": 30, "group": "g"})
    kept = digest.lines()
    assert [n for n, _ in kept] == sorted(n for n, _ in kept)
    steps = [e for _, e in kept if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [29]
    assert kept[-1][1]["seq"] == 30 and len(kept) <= 17


def in_step(tmp_path):
    """Node 0's launcher following node 1's rank through node 1's summaries, by its events:
    the rank recorded an injected fault, so its node does not call it routine (a routine
    rank's row, ddpdoctor.monitor.follow.rank_rows, is tested in test_rank_rows.py)."""
    run, clock, w = two_nodes(tmp_path)
    w.ev(1, "fault", inject="slow:rank=1", fault="slow")
    seq = train(w, clock, 3)
    follower = Monitor(run, node_rank=1, clock=clock, **KW)
    lead = Monitor(run, node_rank=0, clock=clock, **KW)
    follower.poll()
    assert lead.poll().ranks[1].step == 3 and lead.merge.via == {1: 1}
    return run, clock, w, follower, lead, seq


def publish(follower: Monitor, clock) -> None:
    clock.t += 1.0  # a summary a second
    follower.poll()


def tear_second_line(run: RunDir) -> None:
    path = run.node_dir(1) / "summary.json"
    head, _, rest = path.read_bytes().partition(b"\n")
    path.write_bytes(head + b"\n" + rest[: len(rest) // 2])


def test_a_reader_in_step_applies_the_head_only(tmp_path):
    run, clock, w, follower, lead, seq = in_step(tmp_path)
    seq = train(w, clock, 2, seq)
    publish(follower, clock)
    summary = read_node_summary(run, 1)
    assert summary is not None
    (head,) = summary.ranks
    # the head carries what is new since the previous summary, not the rank's whole state
    assert head.after > 0 and {e["kind"] for _, e in head.events} <= {
        "collective_start",
        "collective_end",
        "step",
    }
    assert all(n > head.after for n, _ in head.events) and head.last == head.events[-1][0]
    tear_second_line(run)  # a reader in step never needs it
    assert lead.poll().ranks[1].step == seq == 5


def test_a_reader_that_missed_summaries_rebuilds_from_the_whole_digest(tmp_path):
    run, clock, w, follower, lead, seq = in_step(tmp_path)
    w.ev(1, "warning", code="sampler.missing", message="no DistributedSampler")
    seq = train(w, clock, 2, seq)
    publish(follower, clock)  # the warning is in this summary's head only ...
    seq = train(w, clock, 2, seq)
    publish(follower, clock)  # ... and this one's second line
    summary = read_node_summary(run, 1)
    assert summary is not None and "warning" not in {e["kind"] for _, e in summary.ranks[0].events}
    snap = lead.poll()
    assert snap.ranks[1].step == seq == 7
    assert dict(snap.ranks[1].warnings) == {"sampler.missing": "no DistributedSampler"}
    assert lead.state.ranks[1].collectives_done == 7  # none of the missed ones lost either


def test_a_torn_summary_is_skipped_and_the_next_one_rebuilds(tmp_path):
    run, clock, w, follower, lead, seq = in_step(tmp_path)
    path = run.node_dir(1) / "summary.json"
    seq = train(w, clock, 2, seq)
    publish(follower, clock)
    path.write_bytes(path.read_bytes()[:40])  # a head torn (a copy cut short)
    assert read_node_summary(run, 1) is None
    assert lead.poll().ranks[1].step == 3  # unchanged, no error
    seq = train(w, clock, 2, seq)
    publish(follower, clock)
    tear_second_line(run)  # behind, and the whole digest unreadable: nothing half applied
    assert lead.poll().ranks[1].step == 3 and lead.merge.applied[1] < 20
    seq = train(w, clock, 1, seq)
    publish(follower, clock)
    snap = lead.poll()
    assert snap.ranks[1].step == seq == 8 and lead.state.ranks[1].collectives_done == 8
    # a launcher started again on node 1 counts its summaries from 1: read as new ones
    restarted = Monitor(run, node_rank=1, clock=clock, **KW)
    seq = train(w, clock, 1, seq)
    publish(restarted, clock)
    assert read_node_summary(run, 1).seq == 1  # type: ignore[union-attr]
    assert lead.poll().ranks[1].step == seq == 9


def test_readers_find_the_summary_where_the_writer_puts_it(tmp_path):
    """Readers stat the summary by a path made once per node: the writer's path, as text."""
    from ddpdoctor.protocol import node_summary

    run = RunDir.create(tmp_path / "run")
    for node in (0, 7, 1023):
        path = node_summary.summary_path(run, node)
        assert node_summary._summary_file(run.path, node) == str(path)
    assert node_summary.summary_stamp(run, 7) is None
    node_summary.write_summary_text(run, 7, '{"schema_version": 2}\n{}\n')
    assert node_summary.summary_stamp(run, 7) is not None


def test_a_reader_reads_a_summarys_head_and_the_rest_only_from_the_same_file(tmp_path):
    from ddpdoctor.protocol import node_summary

    run = RunDir.create(tmp_path / "run")
    pad = "x" * (3 * node_summary.HEAD_READ)
    head = {"schema_version": node_summary.SCHEMA_VERSION, "node_rank": 3, "host": "h",
            "pid": 1, "seq": 1, "t": 1.0,
            "ranks": [{"rank": 24, "last": 1, "after": 0, "events": []}]}  # fmt: skip
    whole = {"ranks": [{"rank": 24, "events": [[1, {"rank": 24, "kind": "hello", "p": pad}]]}]}
    text = json.dumps(head) + "\n" + json.dumps(whole) + "\n"
    node_summary.write_summary_text(run, 3, text)
    summary = read_node_summary(run, 3)
    assert summary is not None and summary.source is not None  # the first block only
    assert len(summary.rest) < node_summary.HEAD_READ
    full = summary.full()
    assert full is not None and full[0].events[0][1]["p"] == pad
    node_summary.write_summary_text(run, 3, text.replace('"seq": 1', '"seq": 2'))
    assert summary.full() is None  # another summary since: its rest is not this one's


def test_beyond_512_nodes_a_watcher_reads_each_summary_every_2_s_half_of_them_each_second(
    tmp_path,
):
    from ddpdoctor.monitor.follow.node_publisher import Publisher
    from ddpdoctor.monitor.follow.node_summaries import SUMMARIES_PER_S, SummaryFeed

    run = RunDir.create(tmp_path / "run")
    nodes = {n: NodeRecord(n, f"h{n}", 100 + n) for n in range(SUMMARIES_PER_S + 2)}
    publishers = {n: Publisher(run, n) for n in nodes if n}
    feed = SummaryFeed(run, own_node=0)
    reads: dict[float, set[int]] = {}
    t = 1000.0
    for second in range(6):
        for publisher in publishers.values():
            publisher.maybe_publish(t + second, (), force=True)  # a new summary a second
        for half in (0.0, 0.5):  # two polls a second
            now = t + second + half + 0.1
            reads[now] = {node for node, _ in feed.poll(now, nodes)}
    per_poll = list(reads.values())
    assert per_poll[0] == set(publishers)  # each, first, at once
    later = per_poll[2:]
    # after that, every node every other second: half of them in one second's first poll,
    # the other half in the next one's, none in the polls between
    assert [bool(r) for r in later] == [True, False] * 5
    assert abs(len(later[0]) - len(later[2])) <= 1  # (513 nodes: 257 and 256)
    assert later[0] | later[2] == set(publishers) and not later[0] & later[2]
    assert later[0] == later[4] == later[8]
    assert feed.standing(t + 5.6, nodes) == set(publishers)  # each still stands for its ranks


def test_up_to_512_nodes_a_watcher_reads_each_new_summary_at_its_next_poll(tmp_path):
    from ddpdoctor.monitor.follow.node_publisher import Publisher
    from ddpdoctor.monitor.follow.node_summaries import SummaryFeed

    run = RunDir.create(tmp_path / "run")
    nodes = {n: NodeRecord(n, f"h{n}", 100 + n) for n in range(4)}
    publishers = {n: Publisher(run, n) for n in nodes if n}
    feed = SummaryFeed(run, own_node=0)
    for second in range(3):
        for publisher in publishers.values():
            publisher.maybe_publish(1000.0 + second, (), force=True)
        assert {node for node, _ in feed.poll(1000.1 + second, nodes)} == set(publishers)
        assert feed.poll(1000.6 + second, nodes) == []
