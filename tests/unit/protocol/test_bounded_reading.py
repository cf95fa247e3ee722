"""Every read bounded, every write safe: a run directory's files and dumps are read only when
they are regular files (a FIFO, a device, a symlink out of the run directory is refused without
blocking), within their size caps; what ddpdoctor writes is written atomically, 0600, never
through a link; rank numbers from files stay sparse and a pickle's work is bounded."""

from __future__ import annotations

import io
import json
import os
import pickle
import stat
import struct
from pathlib import Path

import pytest

from ddpdoctor.cli import main
from ddpdoctor.monitor.follow.tail import FileTail
from ddpdoctor.protocol import bounded, fr_files, jsontext, processes
from ddpdoctor.protocol.fr_files import DumpError, load_dump
from ddpdoctor.protocol.node_summary import read_node_summary
from ddpdoctor.protocol.rundir import RunDir, write_text_atomic
from tests.unit.monitor.test_monitor_watch_cmd import healthy_run

pytestmark = pytest.mark.timeout(120)  # a reader that blocks fails here instead of hanging
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "flight_recorder" / "torch-dumps"


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)
    return path


def to_dev_zero(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to("/dev/zero")
    return path


def test_the_shared_reader_refuses_what_is_not_a_regular_file(tmp_path):
    with pytest.raises(bounded.NotRegularFile, match="a FIFO"):
        bounded.read_bytes(fifo(tmp_path / "fifo"))
    with pytest.raises(OSError, match="symlink"):
        bounded.read_bytes(to_dev_zero(tmp_path / "zero"))
    with pytest.raises(bounded.NotRegularFile, match="character device"):
        bounded.open_fd("/dev/zero", follow=True)
    with pytest.raises(bounded.NotRegularFile, match="a directory"):
        bounded.read_bytes(tmp_path)


def test_a_symlink_is_followed_only_to_a_file_inside_its_root(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "real.json").write_text("{}")
    (tmp_path / "outside.json").write_text('{"secret": 1}')
    (tmp_path / "run" / "inside.json").symlink_to(tmp_path / "run" / "real.json")
    (tmp_path / "run" / "out.json").symlink_to(tmp_path / "outside.json")
    assert jsontext.read(tmp_path / "run" / "inside.json", root=tmp_path / "run") == {}
    with pytest.raises(OSError, match="out of"):
        jsontext.read(tmp_path / "run" / "out.json", root=tmp_path / "run")


def test_reads_are_capped_in_bytes(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 5000)
    assert bounded.read_bytes(tmp_path / "big", 100, whole=False) == b"x" * 100
    with pytest.raises(ValueError, match="larger than"):
        bounded.read_bytes(tmp_path / "big", 100)


@pytest.mark.parametrize(
    "text",
    ["[" * 65 + "]" * 65, '{"rank": 1e400}', '{"rank": Infinity}', '{"n": NaN}', "1" * 400],
)
def test_json_from_outside_refuses_deep_nesting_and_numbers_out_of_range(text):
    with pytest.raises(ValueError):
        jsontext.loads(text)


def test_a_fifo_node_summary_does_not_freeze_node_0(tmp_path):
    run = RunDir.create(tmp_path / "run")
    fifo(run.node_dir(1) / "summary.json")
    assert read_node_summary(run, 1) is None


def test_tails_and_process_records_skip_fifos_and_devices(tmp_path):
    run = RunDir.create(tmp_path / "run")
    tail = FileTail(fifo(run.events_file(0)))
    assert tail.read() == [] and "not a regular file" in (tail.error or "")
    assert FileTail(to_dev_zero(run.events_file(1))).read() == []
    fifo(Path(processes.path_in(run.path)))
    assert processes.read(run.path) == []


@pytest.mark.parametrize(
    "name", ["run.json", "diagnosis.json", "events/rank-1.jsonl", "nodes/node-1/node.json"]
)
@pytest.mark.parametrize("make", [fifo, to_dev_zero], ids=["fifo", "dev-zero"])
def test_watch_and_report_never_hang_on_a_special_file(tmp_path, capsys, name, make):
    run = healthy_run(tmp_path)
    make(run / name)
    assert main(["watch", str(run), "--json"]) in (0, 1)
    assert "internal error" not in capsys.readouterr().err
    assert main(["report", str(run), "-o", str(tmp_path / "page.html")]) == 0


def test_report_replaces_a_symlink_and_writes_0600(tmp_path, capsys):
    run = healthy_run(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (run / "report.html").symlink_to(victim)
    trace_victim = tmp_path / "trace-victim"
    trace_victim.write_text("mine too")
    (tmp_path / "trace.json").symlink_to(trace_victim)
    assert main(["report", str(run), "--trace", str(tmp_path / "trace.json")]) == 0
    assert victim.read_text() == "mine" and trace_victim.read_text() == "mine too"
    for written in (run / "report.html", tmp_path / "trace.json"):
        st = os.lstat(written)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600


def test_text_is_written_atomically_and_private(tmp_path):
    target = tmp_path / "page.html"
    write_text_atomic(target, "one")
    write_text_atomic(target, "two")
    assert target.read_text() == "two" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]  # no temp file left


def test_a_dump_named_for_a_huge_rank_keeps_the_world_sparse(tmp_path, capsys):
    dump = json.loads((FIXTURES / "mismatch-json" / "fr_trace_rank_0.json").read_text())
    (tmp_path / "fr_trace_rank_50000000").write_text(json.dumps(dump))
    assert main(["explain", "--json", str(tmp_path / "fr_trace_rank_50000000")]) == 1
    text = capsys.readouterr().out
    findings = json.loads(text)["findings"]
    assert any("50000000" in f["summary"] or f["ranks"] == [50000000] for f in findings), text
    assert len(text) < 100_000  # no list of fifty million ranks "without a dump"


def memo_bomb(references: int) -> bytes:
    """A dump whose entries are `references` memo references to one entry of 1000 sizes."""
    entry = {"profiling_name": "gloo:all_reduce", "input_sizes": [[1] * 1000]}
    body = pickle.dumps(entry, protocol=2)[2:-1]
    out = b"\x80\x02}" + b"X" + struct.pack("<I", 7) + b"entries" + b"](" + body
    out += b"q\xc8" + b"h\xc8" * references + b"es."
    return out


def test_a_pickle_memo_bomb_is_refused_before_it_is_read(tmp_path):
    assert len(pickle.loads(memo_bomb(10))["entries"]) == 11  # the bomb is a valid pickle
    (tmp_path / "fr_trace_rank_0").write_bytes(memo_bomb(100_000))
    with pytest.raises(DumpError, match="expand"):
        load_dump(tmp_path / "fr_trace_rank_0")


def test_a_pickle_whose_keys_take_exponential_hashing_is_stopped_by_its_limits(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(fr_files, "CHILD_CPU_S", 1)
    # a tuple nested 60 deep, each level holding the one below twice (through the memo): its
    # hash walks 2**60 items. As a dict key, loading hashes it.
    out = io.BytesIO()
    out.write(b"\x80\x02}K\x01")  # the dict, then the innermost item
    for _ in range(60):
        out.write(b"q\x01h\x01\x86")  # BINPUT 1, BINGET 1, TUPLE2
    out.write(b"K\x00s.")  # the value; SETITEM; STOP
    (tmp_path / "fr_trace_rank_0").write_bytes(out.getvalue())
    # refused either way: the child killed at its limit, or its answer cut short as it was killed
    with pytest.raises(DumpError, match="not a flight-recorder dump"):
        load_dump(tmp_path / "fr_trace_rank_0")


def test_real_torch_dumps_still_load(tmp_path):
    for folder in ("hang", "mismatch", "subgroup"):
        for path in sorted((FIXTURES / folder).iterdir()):
            if path.name.startswith("fr_trace_rank_"):
                assert load_dump(path).entries
