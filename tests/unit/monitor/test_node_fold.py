"""A node's ranks folded where they run (the Ray relay's node actor): only this host's ranks,
their summary as the merge reads it, a process that ended without an exit event named gone, and
the files given whole for the watcher's run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ddpdoctor.monitor.follow.node_fold import NodeFold
from ddpdoctor.protocol.node_summary import NodeSummary


def _hello(rank: int, host: str, pid: int) -> dict:
    return {"v": 1, "t": time.time(), "mono": 1.0, "rank": rank, "kind": "hello",
            "host": host, "pid": pid, "local_rank": 0, "world_size": 3}  # fmt: skip


def _write(run: Path, rank: int, *events: dict, tail: str = "") -> None:
    events_dir = run / "events"
    events_dir.mkdir(parents=True, exist_ok=True)
    with open(events_dir / f"rank-{rank}.jsonl", "a") as fh:
        fh.write("".join(json.dumps(e) + "\n" for e in events) + tail)


def _head(text: str) -> NodeSummary:
    return NodeSummary.from_head(json.loads(text.splitlines()[0]))


def test_only_this_hosts_ranks_are_summarized_and_a_dead_one_is_gone(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = os.getpid()
    _write(tmp_path, 0, _hello(0, "h1", live))  # another host's rank (a shared directory)
    step = {"v": 1, "t": time.time(), "mono": 2.0, "rank": 1, "kind": "step", "step": 3}
    _write(tmp_path, 1, _hello(1, "h2", live), step, tail='{"v": 1, "t": 1')  # a torn last line
    _write(tmp_path, 2, _hello(2, "h2", dead.pid))
    fold = NodeFold(str(tmp_path), 1, host="h2")
    summary = _head(fold.summary())
    assert summary.node_rank == 1 and summary.host == "h2"
    assert sorted(r.rank for r in summary.ranks) == [1, 2]
    assert summary.gone == (2,)
    rank1 = next(r for r in summary.ranks if r.rank == 1)
    assert [e["kind"] for _, e in rank1.events] == ["hello", "step"]
    assert set(fold.ranks()) == {1, 2}
    whole = fold.file_bytes(1)
    assert whole.count(b"\n") == 2 and not whole.endswith(b'{"v": 1, "t": 1')
    assert fold.file_bytes(0) == b""  # not this host's


def test_a_rank_file_that_is_not_a_regular_file_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "events").mkdir()
    os.mkfifo(tmp_path / "events" / "rank-0.jsonl")
    (tmp_path / "events" / "rank-1.jsonl").symlink_to("/etc/passwd")
    fold = NodeFold(str(tmp_path), 1, host="h2")
    assert _head(fold.summary()).ranks == ()


def test_a_summary_names_gone_ranks_only_as_integers_and_boundedly() -> None:
    head = {"schema_version": 3, "node_rank": 1, "seq": 1, "t": 1.0, "ranks": [],
            "gone": [1, "2", True, 3.0, 4] + [5] * 5000}  # fmt: skip
    gone = NodeSummary.from_head(head).gone
    assert gone[:2] == (1, 4) and len(gone) < 4096
    del head["gone"]
    assert NodeSummary.from_head(head).gone == ()


def test_a_node_may_send_back_only_its_answers_and_stacks(tmp_path: Path) -> None:
    from ddpdoctor.monitor.follow.ray_relay import _ANSWER_PATH, _append

    assert _ANSWER_PATH.match("requests/20261128-h1-12-1.node1.done")
    assert _ANSWER_PATH.match("stacks/cap-1/rank-3.json")
    for bad in ("run.json", "events/rank-1.jsonl", "stacks/../run.json", "stacks/a/b/c.json",
                "requests/x.json", "diagnosis.json"):  # fmt: skip
        assert not _ANSWER_PATH.match(bad), bad
    target = tmp_path / "rank-1.jsonl"
    _append(target, b"a\n", 0)
    _append(target, b"b\n", 2)
    assert target.read_bytes() == b"a\nb\n" and oct(target.stat().st_mode)[-3:] == "600"
    (tmp_path / "link").symlink_to(target)
    try:
        _append(tmp_path / "link", b"x\n", 4)
    except OSError:
        pass
    assert target.read_bytes() == b"a\nb\n"


# A rank's process whose main thread has left (pthread_exit) while its writer thread goes on:
# the thread group leader shows as a zombie, and the thread still writes the rank's events.
_LEADER_LEAVES = r"""
import ctypes, json, os, sys, threading, time
path, go = sys.argv[1], sys.argv[2]
def line(kind, **fields):
    event = {"v": 1, "t": time.time(), "mono": 1.0, "rank": 1, "kind": kind, **fields}
    with open(path, "a") as fh:
        fh.write(json.dumps(event) + "\n")
line("hello", host="h2", pid=os.getpid(), local_rank=0, world_size=2)
def writer():
    while not os.path.exists(go):
        time.sleep(0.01)
    line("replica_digest", model=0, step=3, final=True, digests=[1])
threading.Thread(target=writer).start()
ctypes.CDLL(None).pthread_exit(None)
"""


def _until(test, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not test():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_rank_is_gone_only_once_none_of_its_threads_can_write(tmp_path: Path) -> None:
    import psutil

    events = tmp_path / "events"
    events.mkdir()
    path, go = events / "rank-1.jsonl", tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", _LEADER_LEAVES, str(path), str(go)])
    try:
        ps = psutil.Process(proc.pid)
        _until(lambda: ps.status() == psutil.STATUS_ZOMBIE, "its main thread never left")
        fold = NodeFold(str(tmp_path), 1, host="h2")
        assert _head(fold.summary()).gone == ()  # its writer thread runs: not gone
        go.touch()
        _until(lambda: ps.num_threads() <= 1, "its writer thread never ended", 30.0)
        summary = _head(fold.summary())
        assert summary.gone == (1,) and fold.files[1].line_no == 2  # every line read first
    finally:
        proc.kill()
        proc.wait(timeout=30)
