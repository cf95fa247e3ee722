"""Stack requests through the run directory: the files, a launcher answering, a watcher folding
the answers in (py-spy replaced by recorded dumps; real files throughout)."""

from __future__ import annotations

import json
import os
import time

import pytest

from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.protocol.stack_requests import (
    Asker,
    StackAnswer,
    answer_path,
    answered_by,
    prune,
    read_answers,
    request_path,
    scan_requests,
    write_answer,
    write_request,
)
from ddpdoctor.stacks import capture as stacks_module
from ddpdoctor.stacks.capture import CommandResult, PtraceFacts, capture_stacks
from ddpdoctor.stacks.collector import StackCollector
from ddpdoctor.stacks.groups import StackCapture
from ddpdoctor.stacks.responder import StackResponder
from tests.procs import REPO

T0 = 1_800_000_000.0
WATCH = Asker("vm", 4242, "watch", None)
RECORDED = REPO / "tests" / "fixtures" / "stacks" / "gloo-barrier-vs-sleep"
# Recorded py-spy dumps: a rank blocked in a gloo barrier, and one sleeping in Python.
DUMPS = [(RECORDED / f"rank-{r}.json").read_text() for r in (0, 1)]
OPEN = PtraceFacts(yama_scope=None, cap_sys_ptrace=True, euid=0)


@pytest.fixture
def run(tmp_path) -> RunDir:
    return RunDir.create(tmp_path / "run")


# -- the files -------------------------------------------------------------------------------


def test_a_request_is_written_whole_and_found_until_its_deadline(run):
    request = write_request(run, [3, 1, 3], asked_by=WATCH, timeout_s=10, now=T0)
    assert request.ranks == (1, 3) and request.deadline_t == T0 + 10
    assert request_path(run, request.id).is_file()
    assert not [p for p in run.requests_dir.iterdir() if p.name.startswith(".")]  # no temp left
    assert scan_requests(run, now=T0 + 5) == [request]
    assert scan_requests(run, now=T0 + 10) == []  # expired: launchers no longer answer
    assert scan_requests(run, now=T0 + 10, include_expired=True) == [request]
    second = write_request(run, [0], asked_by=WATCH, now=T0 + 1)
    assert second.id != request.id
    assert [r.id for r in scan_requests(run, now=T0 + 2)] == [request.id, second.id]


def test_torn_and_foreign_files_are_ignored(run):
    good = write_request(run, [1], asked_by=WATCH, now=T0)
    folder = run.requests_dir
    (folder / "torn-1.json").write_text('{"schema_version": 1, "id": "torn-1", "ra')
    (folder / "other-2.json").write_text(json.dumps({"hello": "world"}))
    (folder / "notes.txt").write_text("not a request")
    (folder / ".tmp-3.json.abc").write_text(json.dumps(good.to_json()))  # a writer's temp file
    renamed = dict(good.to_json(), id="someone-else")
    (folder / "copied-4.json").write_text(json.dumps(renamed))  # id does not match the name
    (folder / "neg-5.json").write_text(json.dumps(dict(good.to_json(), id="neg-5", ranks=[-1])))
    assert scan_requests(run, now=T0) == [good]
    # Answers: a torn one, one filed under the wrong node, and a good one.
    answer = StackAnswer(good.id, 1, "vm", 77, "cap-1", (1,), (), T0 + 1)
    write_answer(run, answer)
    (folder / f"{good.id}.node2.done").write_text('{"schema_version": 1, "request_id"')
    (folder / f"{good.id}.node3.done").write_text(json.dumps(answer.to_json()))
    assert read_answers(run, good.id) == {1: answer}
    assert answered_by(run, good.id, 1) and not answered_by(run, good.id, 0)


def test_prune_removes_old_requests_with_their_answers(run):
    old = write_request(run, [1], asked_by=WATCH, timeout_s=5, now=T0)
    fresh = write_request(run, [1], asked_by=WATCH, timeout_s=5, now=T0 + 3000)
    for request in (old, fresh):
        write_answer(run, StackAnswer(request.id, 1, "vm", 77, None, (), ((1, "gone"),)))
    orphan = run.requests_dir / "gone-9.node0.done"
    orphan.write_text("{}")
    assert prune(run, now=T0 + 3700, retain_s=3600) == 3
    assert not request_path(run, old.id).exists() and not answer_path(run, old.id, 1).exists()
    assert not orphan.exists()
    assert request_path(run, fresh.id).exists() and answer_path(run, fresh.id, 1).exists()


# -- a launcher answering --------------------------------------------------------------------


class RecordingCapture:
    """capture_stacks with a recorded py-spy: real dumps and summaries in RUN_DIR/stacks/."""

    def __init__(self) -> None:
        self.calls: list[dict[int, int]] = []

    def __call__(self, run, targets, **kw) -> StackCapture:
        self.calls.append(dict(targets))
        by_pid = {pid: DUMPS[rank % 2] for rank, pid in targets.items()}

        def spy(cmd, timeout):
            return CommandResult(0, by_pid[int(cmd[cmd.index("--pid") + 1])], "")

        kw.pop("timeout_s", None)
        return capture_stacks(run, targets, runner=spy, pyspy="py-spy", ptrace=OPEN, **kw)


def test_a_launcher_answers_for_its_own_ranks_once(run):
    capture = RecordingCapture()
    clock = [T0]
    responder = StackResponder(run, 1, clock=lambda: clock[0], capture=capture)
    mine = {2: 1002, 3: None}  # rank 3's process has ended
    theirs = write_request(run, [0, 2, 3], asked_by=WATCH, now=T0)
    not_mine = write_request(run, [0, 1], asked_by=WATCH, now=T0)
    own = write_request(run, [2], asked_by=responder.me, now=T0)  # its own monitor asked
    responder.poll(mine)
    answer = responder.wait(5)
    assert capture.calls == [{2: 1002}]
    assert answer is not None and answer.request_id == theirs.id
    assert (answer.node, answer.ranks, answer.errors) == (1, (2,), ((3, "its process had ended"),))
    stored = read_answers(run, theirs.id)[1]
    assert stored == answer
    summary = json.loads((run.stacks_dir / answer.capture_id / "capture.json").read_text())
    assert summary["captured_by"] == {"host": responder.me.host, "pid": responder.me.pid,
                                      "role": "launcher", "node": 1}  # fmt: skip
    assert summary["request_id"] == theirs.id
    assert (run.stacks_dir / answer.capture_id / "rank-2.json").is_file()
    for _ in range(3):  # later polls: nothing else is its to answer
        clock[0] += 2
        responder.poll(mine)
        responder.wait(5)
    assert len(capture.calls) == 1
    assert read_answers(run, not_mine.id) == {} and read_answers(run, own.id) == {}


def test_an_expired_request_is_not_answered(run):
    capture = RecordingCapture()
    write_request(run, [2], asked_by=WATCH, timeout_s=5, now=T0)
    responder = StackResponder(run, 1, clock=lambda: T0 + 6, capture=capture)
    responder.poll({2: 1002})
    assert responder.wait(1) is None and capture.calls == []


# -- a watcher folding answers in ------------------------------------------------------------


def settle_local(collector: StackCollector) -> None:
    """Poll until the round's own capture is in (its answers may still be outstanding)."""
    deadline = time.monotonic() + 10
    while "here" in (collector.status or "") and time.monotonic() < deadline:
        time.sleep(0.02)
        collector.collect()


def answer_from_node(run: RunDir, request_id: str, node: int, ranks: dict[int, int]) -> None:
    capture = RecordingCapture()(
        run, ranks, captured_by={"node": node, "role": "launcher"}, request_id=request_id
    )
    write_answer(
        run,
        StackAnswer(request_id, node, "other", 99, capture.capture_id, tuple(sorted(ranks))),
    )


def test_a_round_folds_local_and_remote_stacks_as_they_arrive(run, monkeypatch):
    local = RecordingCapture()
    monkeypatch.setattr(stacks_module, "capture_stacks", local)
    now = [time.time()]
    collector = StackCollector(run, asker=WATCH, clock=lambda: now[0], request_timeout_s=30)
    assert collector.start({0: 1000}, remote={1: 1, 2: 1, 3: 2})
    request = collector.last_request
    assert request.ranks == (1, 2, 3) and request.asked_by == WATCH
    settle_local(collector)  # the local capture ends; the round still waits for the others
    assert collector.busy and collector.status.startswith("capturing")
    assert "waiting for rank(s) 1, 2, 3 from node 1, node 2" in collector.status
    assert sorted(r for g in collector.groups for r in g.ranks) == [0]
    answer_from_node(run, request.id, 1, {1: 1001, 2: 1002})
    collector.collect()
    assert sorted(r for g in collector.groups for r in g.ranks) == [0, 1, 2]
    assert "waiting for rank(s) 3 from node 2" in collector.status
    answer_from_node(run, request.id, 2, {3: 1003})
    collector.collect()
    assert not collector.busy
    assert sorted(r for g in collector.groups for r in g.ranks) == [0, 1, 2, 3]
    assert "captured 4 ranks" in collector.status and "by node 1, 2's launcher" in collector.status
    own = json.loads(next(run.stacks_dir.glob("*/capture.json")).read_text())
    assert own["request_id"] == request.id  # the round's own capture carries the round's id


def test_a_node_that_does_not_answer_is_named_past_the_deadline(run, monkeypatch):
    monkeypatch.setattr(stacks_module, "capture_stacks", RecordingCapture())
    now = [time.time()]
    ended = {2}
    collector = StackCollector(
        run, asker=WATCH, clock=lambda: now[0], request_timeout_s=5,
        launcher_ended=lambda node: node in ended,
    )  # fmt: skip
    collector.start({0: 1000}, remote={1: 1, 2: 2, 3: None})
    settle_local(collector)
    now[0] += 6
    collector.collect()
    assert not collector.busy
    (finding,) = [f for f in collector.findings if f.id == "stacks.node_no_answer"]
    assert finding.ranks == (1, 2, 3)
    assert "node 1's launcher did not answer within 5 s" in finding.summary
    assert "node 2's launcher had ended" in finding.summary
    assert "no launcher is known for rank(s) 3" in finding.summary
    assert "no answer for rank(s) 1, 2, 3" in collector.status


def test_a_post_mortem_shows_the_whole_round_of_several_nodes(run):
    request = write_request(run, [1], asked_by=Asker("vm", 7, "launcher", 0), now=T0)
    RecordingCapture()(run, {0: 1000}, request_id=request.id)
    answer_from_node(run, request.id, 1, {1: 1001})
    RecordingCapture()(run, {5: 1005})  # an older, unrelated capture is not mixed in
    answer_id = read_answers(run, request.id)[1].capture_id
    now = time.time()
    for folder in run.stacks_dir.iterdir():  # the round's answer is the latest folder
        stamp = now if folder.name == answer_id else now - 1000
        os.utime(folder, (stamp, stamp))
    collector = StackCollector(run)
    assert collector.load_latest()
    assert sorted(r for g in collector.groups for r in g.ranks) == [0, 1]
    assert answer_id in collector.status and " + " in collector.status  # "capture A + B"


def test_a_failed_capture_here_stays_in_the_status_beside_the_answers(run, monkeypatch):
    """py-spy failing on this node (a timeout on a loaded host) while another node answered:
    the round's status says both, not "captured 1 rank" alone."""

    def failing(run, targets, **kw):
        raise TimeoutError("py-spy did not answer within 10 s")

    monkeypatch.setattr(stacks_module, "capture_stacks", failing)
    collector = StackCollector(run, asker=WATCH, request_timeout_s=30)
    collector.start({0: 1000}, remote={1: 1})
    settle_local(collector)
    answer_from_node(run, collector.last_request.id, 1, {1: 1001})
    collector.collect()
    assert not collector.busy
    assert sorted(r for g in collector.groups for r in g.ranks) == [1]
    assert collector.status.startswith("captured 1 rank")
    assert "here: stack capture failed: TimeoutError: py-spy did not answer" in collector.status
