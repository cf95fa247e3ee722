from __future__ import annotations

import os

from ddpdoctor.monitor.follow.tail import MAX_PARTIAL_BYTES, FileTail, RunTailer
from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.protocol.torchrun_logs import AGENT_LOG, NCCL_LOG, RANK_LOG


def test_torn_last_line_waits_for_its_newline(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": ')
    tail = FileTail(path)
    assert tail.read() == [(1, b'{"a": 1}')]
    assert tail.read() == []
    with open(path, "ab") as fh:
        fh.write(b'2}\n{"c": 3}\r\n')
    assert tail.read() == [(2, b'{"b": 2}'), (3, b'{"c": 3}')]


def test_file_that_appears_late(tmp_path):
    tail = FileTail(tmp_path / "late.log")
    assert tail.read() == []
    (tmp_path / "late.log").write_text("hello\n")
    assert tail.read() == [(1, b"hello")]


def test_truncation_reads_again_from_the_start(tmp_path):
    path = tmp_path / "f.log"
    path.write_text("one\ntwo\nthree\n")
    tail = FileTail(path)
    assert len(tail.read()) == 3
    path.write_text("new\n")  # shorter than what was read: truncated and rewritten
    assert tail.read() == [(1, b"new")]
    assert tail.resets == 1


def test_rotation_to_a_new_inode_reads_the_new_file(tmp_path):
    path = tmp_path / "f.log"
    path.write_text("old 1\nold 2\nold 3\n")
    tail = FileTail(path)
    tail.read()
    os.rename(path, tmp_path / "f.log.1")
    path.write_text("fresh 1\nfresh 2\nfresh 3\nfresh 4\n")
    assert [t for _, t in tail.read()] == [b"fresh 1", b"fresh 2", b"fresh 3", b"fresh 4"]


def test_a_runaway_line_is_cut_not_kept_forever(tmp_path):
    path = tmp_path / "f.log"
    path.write_bytes(b"x" * (MAX_PARTIAL_BYTES + 10))
    tail = FileTail(path)
    lines = tail.read()
    assert len(lines) == 1 and len(lines[0][1]) == MAX_PARTIAL_BYTES + 10
    assert tail.partial == b""


def test_read_is_bounded_per_poll(tmp_path):
    path = tmp_path / "f.log"
    path.write_bytes(b"abcdefghi\n" * 10)
    tail = FileTail(path)
    first = tail.read(max_bytes=35)
    assert [n for n, _ in first] == [1, 2, 3]
    rest = tail.read()
    assert [n for n, _ in rest] == list(range(4, 11))


def test_run_tailer_finds_every_kind_of_file(tmp_path):
    run = RunDir.create(tmp_path / "run")
    (run.events_dir / "rank-0.jsonl").write_text('{"kind": "hello", "rank": 0}\n')
    rank_log = run.logs_dir / "vm" / "none_ab12" / "attempt_0" / "1"
    rank_log.mkdir(parents=True)
    (rank_log / "stderr.log").write_text("boom\n")
    (run.logs_dir / "vm" / "torchrun.log").write_text(
        "W... Sending process 5 closing signal SIGTERM\n"
    )
    (run.nccl_dir / "vm.local.4242.log").write_text("vm:4242:4242 [0] NCCL INFO Bootstrap\n")
    tailer = RunTailer(run, discover_every_s=0.0)
    batch = tailer.poll(0.0)
    assert [e.rel for e in batch.events] == ["events/rank-0.jsonl"]
    kinds = {log.source.kind: log.source for log in batch.logs}
    assert kinds[RANK_LOG].local_rank == 1 and kinds[RANK_LOG].stream == "stderr"
    assert kinds[RANK_LOG].host == "vm" and kinds[RANK_LOG].attempt == 0
    assert kinds[AGENT_LOG].host == "vm"
    assert kinds[NCCL_LOG].host == "vm.local" and kinds[NCCL_LOG].pid == 4242
    assert tailer.poll(1.0).empty
    (run.events_dir / "rank-1.jsonl").write_text('{"kind": "hello", "rank": 1}\n')
    assert [e.rel for e in tailer.poll(2.0).events] == ["events/rank-1.jsonl"]
