"""A node summary rewritten by the job stops nothing (ddpdoctor.monitor.follow.row_claims): a
call another node's row names is compared only once a later write of that node bears it out,
and writes that disagree dispute the node (a warning; its rows then decide no stop). A real
mismatch across nodes, carried by two successive summaries, is still a mismatch."""

from __future__ import annotations

import json

from ddpdoctor.monitor.follow.row_claims import RowClaims
from ddpdoctor.monitor.model.snapshot import CollectiveView, Verdict
from tests.unit.monitor.test_node_summaries import publish
from tests.unit.monitor.test_rank_rows import rowed


def summary_head(run) -> tuple[dict, bytes]:
    path = run.node_dir(1) / "summary.json"
    head, _, rest = path.read_bytes().partition(b"\n")
    return json.loads(head), rest


def rewrite(run, data: dict, rest: bytes) -> None:
    path = run.node_dir(1) / "summary.json"
    tmp = path.with_name(".forged.tmp")
    tmp.write_bytes(json.dumps(data).encode() + b"\n" + rest)
    tmp.replace(path)


def forge(run, seq: int, *, number: int | None = None) -> dict:
    """Node 1's summary as its launcher last wrote it, rank 1's row naming a broadcast of
    [7, 3] at `seq` (its launcher's host and pid, the next write number, a line further)."""
    data, rest = summary_head(run)
    rows, calls = data["rows"], data["calls"]
    recent = rows["same"]["recent"]
    what = json.loads(calls[recent[-1]][5])
    what[0] = [[7, 3]]
    calls.append(["broadcast", "default", seq, 1.0, 0.0, json.dumps(what)])
    rows["same"]["recent"] = [n for n in recent if calls[n][2] != seq] + [len(calls) - 1]
    rows["last"] = [n + 1 for n in rows["last"]]
    data["seq"] = data["seq"] + 1 if number is None else number
    rewrite(run, data, rest)
    return data


def rank_0_waits(w, clock, seq: int) -> None:
    w.ev(0, "collective_start", op="all_reduce", seq=seq, group="default", shapes=[[10]],
         dtypes=["float32"])  # fmt: skip
    clock.t += 0.5


def ids(snap) -> dict[str, str]:
    return {f.id: f.summary for f in snap.findings}


def test_one_forged_write_between_real_ones_is_no_mismatch_and_disputes_the_node(tmp_path):
    run, clock, w, follower, lead, seq = rowed(tmp_path)
    lead.poll()
    rank_0_waits(w, clock, seq + 1)
    forge(run, seq + 1)
    snap = lead.poll()
    assert snap.verdict is Verdict.RUNNING
    assert all(c.op != "broadcast" for c in snap.ranks[1].recent_collectives)  # not borne out
    # the launcher's own writes: rank 1 really goes on to all_reduce #seq+1
    w.ev(1, "collective_start", op="all_reduce", seq=seq + 1, group="default", shapes=[[10]],
         dtypes=["float32"])  # fmt: skip
    for _ in range(6):
        publish(follower, clock)
        snap = lead.poll()
        assert snap.verdict is not Verdict.MISMATCH and not snap.confirmed
    said = ids(snap)
    # the forged write took the launcher's next number: its own write then is the second one
    assert "two different writes numbered" in said["node.summary_disputed"], said
    assert lead.merge.claims.disputed.keys() == {1} and lead.merge.via == {1: 1}
    # and the number disagreed on is compared no more: neither call is rank 1's there
    assert all(c.seq != seq + 1 for c in snap.ranks[1].recent_collectives)


def test_another_call_at_a_number_named_before_disputes_the_node(tmp_path):
    run, clock, _w, follower, lead, seq = rowed(tmp_path)
    lead.poll()
    data, _ = summary_head(run)
    forge(run, seq, number=data["seq"] + 5)  # rank 1's latest call (#7), forged
    snap = lead.poll()
    said = ids(snap)
    assert f"broadcast #{seq} of [7, 3]" in said["node.summary_disputed"], said
    assert f"all_reduce #{seq} of [10]" in said["node.summary_disputed"], said
    assert snap.verdict is Verdict.RUNNING
    publish(follower, clock)  # the launcher's own: a write number going back, too
    assert lead.poll().verdict is Verdict.RUNNING


def test_a_rewrite_again_and_again_never_decides_a_stop(tmp_path):
    """The forged call borne out by the forger's own writes (numbered on, 0.3 s apart), the
    launcher's writes read now and then: the node is disputed, and nothing is confirmed."""
    run, clock, w, follower, lead, seq = rowed(tmp_path)
    lead.poll()
    rank_0_waits(w, clock, seq + 1)
    data = forge(run, seq + 1)
    for i in range(8):
        clock.t += 0.3
        if i % 3 == 2:  # the launcher's own write, read between the forger's
            publish(follower, clock)
        else:
            _, rest = summary_head(run)
            data["seq"] += 1
            data["rows"]["last"] = [n + 1 for n in data["rows"]["last"]]
            rewrite(run, data, rest)
        snap = lead.poll()
        assert not snap.confirmed, snap.findings
    assert "node.summary_disputed" in ids(snap)


def test_two_writes_with_one_number_dispute_the_node(tmp_path):
    run, _clock, _w, _follower, lead, seq = rowed(tmp_path)
    lead.poll()
    data, _ = summary_head(run)
    forge(run, seq + 1, number=data["seq"])  # the number the watcher has read already
    snap = lead.poll()
    said = ids(snap)
    assert f"two different writes numbered #{data['seq']}" in said["node.summary_disputed"]
    assert snap.verdict is Verdict.RUNNING


def test_a_real_mismatch_carried_by_two_summaries_is_a_mismatch(tmp_path):
    _run, clock, w, follower, lead, seq = rowed(tmp_path)
    lead.poll()
    for rank, shape in ((0, [10]), (1, [20])):
        w.ev(rank, "collective_start", op="all_reduce", seq=seq + 1, group="default",
             shapes=[shape], dtypes=["float32"])  # fmt: skip
    clock.t += 0.5
    publish(follower, clock)
    snap = lead.poll()
    assert snap.verdict is Verdict.RUNNING and ("default", 8) in lead.state.ranks[1].claimed
    verdicts = []
    for _ in range(4):  # borne out by the next write; told once node 1 covers the time
        w.ev(1, "heartbeat", cpu_s=1.0, open={"op": "all_reduce", "seq": seq + 1})
        publish(follower, clock)
        verdicts.append(lead.poll().verdict)
    assert verdicts[-1] is Verdict.MISMATCH, verdicts
    snap = lead.poll()
    assert snap.confirmed and "[20]" in snap.findings[0].summary
    assert "node.summary_disputed" not in ids(snap)


def call(op: str, seq: int, shape: list[int]) -> CollectiveView:
    return CollectiveView(op, seq, 0.0, shapes=(tuple(shape),), dtypes=("float32",))


def unborne(claims: RowClaims, node: int, calls, pids, now: float) -> set:
    known = claims.weigh(node, calls, pids, now).calls
    return {key for key, claim in known.items() if not claim.borne}


def test_a_call_counts_from_a_later_write_that_names_it_the_same():
    claims = RowClaims()
    first = [call("all_reduce", 1, [4]), call("all_reduce", 2, [4])]
    assert unborne(claims, 1, first, (100,), 10.0) == {("default", 1), ("default", 2)}
    # a write read too soon after (a process rewriting the file faster than its launcher)
    assert unborne(claims, 1, first, (100,), 10.5) == {("default", 1), ("default", 2)}
    later = [*first, call("all_reduce", 3, [4])]
    assert unborne(claims, 1, later, (100,), 11.0) == {("default", 3)}
    assert not claims.disputed
    # another call at a number named before: disputed, and that number compared no more
    assert unborne(claims, 1, [call("broadcast", 2, [7, 3])], (100,), 12.0) == {
        ("default", 2),
        ("default", 3),
    }
    assert unborne(claims, 1, later, (100,), 13.0) == {("default", 2)}
    assert "broadcast #2 of [7, 3]" in claims.disputed[1]
    assert "all_reduce #2 of [4]" in claims.disputed[1]
    # a rank started again numbers its calls anew: not a dispute
    other = RowClaims()
    other.weigh(1, first, (100,), 10.0)
    other.weigh(1, [call("broadcast", 2, [7, 3])], (101,), 11.0)
    assert not other.disputed


def test_a_forged_call_among_a_ranks_events_waits_for_a_later_write_and_disputes(tmp_path):
    """A rank that is not routine comes as its events, with their line numbers: a rewritten
    summary gives a forged broadcast and its end the lines the rank's own next events will
    have (its own are then skipped as read). The call is compared only once a later write
    carries it at those lines; the launcher's writes carry the rank's own: a dispute."""
    run, clock, w, follower, lead, seq = rowed(tmp_path)
    w.ev(1, "fault", inject="slow:rank=1", fault="slow")  # not routine: its events, not a row
    publish(follower, clock)
    lead.poll()
    assert lead.merge.rowed == set() and lead.merge.via == {1: 1}
    rank_0_waits(w, clock, seq + 1)
    data, rest = summary_head(run)
    (entry,) = data["ranks"]
    line = entry["last"]
    forged = {"v": 1, "t": clock.t, "rank": 1, "op": "broadcast", "seq": seq + 1,
              "group": "default", "shapes": [[7, 3]], "dtypes": ["float32"]}  # fmt: skip
    entry["events"] = [
        [line + 1, {**forged, "kind": "collective_start"}],
        [line + 2, {**forged, "kind": "collective_end", "duration_s": 0.01}],
    ]
    entry["after"], entry["last"] = line, line + 2
    data["seq"] += 1
    rewrite(run, data, rest)
    snap = lead.poll()
    assert snap.verdict is Verdict.RUNNING and ("default", 8) in lead.state.ranks[1].claimed
    assert all(c.op != "broadcast" for c in snap.ranks[1].recent_collectives)
    # rank 1's own next call, at those lines, as its launcher writes them
    w.ev(1, "collective_start", op="all_reduce", seq=seq + 1, group="default", shapes=[[10]],
         dtypes=["float32"])  # fmt: skip
    w.ev(1, "collective_end", op="all_reduce", seq=seq + 1, group="default", duration_s=0.01)
    for _ in range(5):
        publish(follower, clock)
        snap = lead.poll()
        assert not snap.confirmed and snap.verdict is not Verdict.MISMATCH, snap.findings
    said = ids(snap)["node.summary_disputed"]
    assert f"rank 1's line {line + 1}" in said or "two different writes numbered" in said, said


def test_a_ranks_own_calls_among_its_events_are_compared_a_write_later(tmp_path):
    _run, clock, w, follower, lead, seq = rowed(tmp_path)
    w.ev(1, "fault", inject="slow:rank=1", fault="slow")
    publish(follower, clock)
    lead.poll()
    for rank, shape in ((0, [10]), (1, [20])):
        w.ev(rank, "collective_start", op="all_reduce", seq=seq + 1, group="default",
             shapes=[shape], dtypes=["float32"])  # fmt: skip
    clock.t += 0.5
    publish(follower, clock)
    assert lead.poll().verdict is Verdict.RUNNING
    assert ("default", seq + 1) in lead.state.ranks[1].claimed
    verdicts = []
    for _ in range(4):
        w.ev(1, "heartbeat", cpu_s=1.0, open={"op": "all_reduce", "seq": seq + 1})
        publish(follower, clock)
        verdicts.append(lead.poll().verdict)
    assert lead.state.ranks[1].claimed == set()
    assert verdicts[-1] is Verdict.MISMATCH, verdicts
    assert "node.summary_disputed" not in ids(lead.poll())
