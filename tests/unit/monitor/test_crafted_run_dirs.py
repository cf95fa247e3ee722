"""A run directory may come from anywhere: a crafted or corrupted one gives a verdict (with a
finding for what was skipped) or one clear error, never a MemoryError or a RecursionError."""

from __future__ import annotations

import json
import subprocess
import sys

from ddpdoctor.cli import main
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.events import parse_event_line
from tests.unit.monitor.test_monitor_watch_cmd import healthy_run

DEEP = "[" * 200_000 + "]" * 200_000


def append_event(run, **event) -> None:
    line = {"v": 1, "t": 1.0, "mono": 1.0, "kind": "step", "step": 3, **event}
    with open(run / "events" / "rank-0.jsonl", "a") as fh:
        fh.write(json.dumps(line) + "\n")


def test_an_event_of_a_rank_far_outside_the_world_is_skipped_with_a_finding(tmp_path, capsys):
    run = healthy_run(tmp_path)
    append_event(run, rank=1_000_000)
    assert main(["watch", str(run), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "healthy" and len(doc["ranks"]) == 2
    (finding,) = [f for f in doc["findings"] if f["id"] == "run.bad_events"]
    assert "rank 1000000 is outside the world" in finding["summary"]
    assert "events/rank-0.jsonl:" in finding["summary"]


def test_a_made_up_world_size_allocates_no_views_beyond_the_bound(tmp_path):
    """In a child with 2 GiB of address space (the old reader allocated until MemoryError), and
    the bound lowered to 64 ranks so that the test does not build 65536 rank views."""
    run = healthy_run(tmp_path)
    (run / "run.json").write_text(json.dumps({"world_size": 10**9}))
    append_event(run, rank=7, kind="hello", world_size=10**12)  # a hello stating one too
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30));"
        "import ddpdoctor.protocol.events as ev; ev.MAX_RANKS = 64;"
        "from ddpdoctor.cli import main; sys.exit(main(['watch', sys.argv[1], '--json']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(run)], capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr
    assert len(json.loads(proc.stdout)["ranks"]) == 64


def test_deeply_nested_json_is_not_json(tmp_path, capsys):
    run = healthy_run(tmp_path)
    with open(run / "events" / "rank-0.jsonl", "a") as fh:
        fh.write('{"v": 1, "kind": "step", "rank": 0, "x": ' + DEEP + "}\n")
    (run / "diagnosis.json").write_text(DEEP)
    (run / "run.json").write_text(DEEP)
    assert main(["watch", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "healthy"
    assert main(["watch", str(run), "--no-tui"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_bounded_json_readers(tmp_path):
    assert parse_event_line('{"kind": "x", "rank": 0, "a": ' + DEEP + "}") is None
    big = tmp_path / "big.json"
    big.write_text('"' + "x" * 100 + '"')
    assert jsontext.read(big) == "x" * 100
    try:
        jsontext.read(big, max_bytes=50)
    except ValueError as exc:
        assert "larger than" in str(exc)
    else:
        raise AssertionError("a file over the bound was read")
