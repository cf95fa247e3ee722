from __future__ import annotations

import json

import pytest

from ddpdoctor.errors import UsageError
from ddpdoctor.protocol.events import encode_event, parse_event_line
from ddpdoctor.protocol.rundir import RunDir, write_json_atomic
from ddpdoctor.reference.inject import parse_inject


def test_inject_specs_parse():
    spec = parse_inject("hang:rank=1,step=10")
    assert (spec.kind, spec.rank, spec.step, spec.seconds) == ("hang", 1, 10, None)
    assert spec.applies(1, 10) and not spec.applies(1, 11) and not spec.applies(0, 10)
    slow = parse_inject("slow:rank=0,seconds=0.2")
    assert slow.seconds == 0.2 and slow.applies(0, slow.step + 3)
    assert parse_inject(slow.text) == slow


@pytest.mark.parametrize(
    "text, words",
    [
        ("explode:rank=1", "unknown fault kind"),
        ("hang", "missing rank"),
        ("hang:step=3", "missing rank"),
        ("hang:rank=x", "not an integer"),
        ("hang:rank=-1", "must be >= 0"),
        ("hang:rank=0,step=0", "must be >= 1"),
        ("hang:rank=0,color=red", "unknown key"),
        ("slow:rank=0,seconds=fast", "not a number"),
        ("hang:rank", "not KEY=VALUE"),
    ],
)
def test_bad_inject_specs_are_usage_errors(text, words):
    with pytest.raises(UsageError, match=words):
        parse_inject(text)


def test_inject_rank_outside_world():
    with pytest.raises(UsageError, match="outside the world"):
        parse_inject("crash:rank=4").check_world(2)


def test_run_dir_create_and_open(tmp_path):
    run = RunDir.create(tmp_path / "r")
    assert run.events_dir.is_dir() and run.logs_dir.is_dir() and run.stacks_dir.is_dir()
    write_json_atomic(run.run_json, {"world_size": 2})
    assert RunDir.open(run.path).read_run_json() == {"world_size": 2}
    with pytest.raises(UsageError, match="not a run directory"):
        RunDir.open(tmp_path / "missing")


def test_run_dir_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="cannot create run directory"):
        RunDir.create(blocker / "sub")


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"   ",
        b'{"kind": "hello", "rank": 0',
        b"not json",
        b'["list"]',
        b'{"rank": 0}',
        b'{"kind": "x", "rank": "0"}',
        b"\xff\xfe",
    ],
)
def test_torn_or_foreign_lines_are_ignored(line):
    assert parse_event_line(line) is None


def test_events_round_trip_on_one_line():
    event = {"v": 1, "kind": "error", "rank": 3, "message": "a\nb", "obj": object()}
    line = encode_event(event)
    assert "\n" not in line
    back = parse_event_line(line.encode())
    assert back is not None and back["message"] == "a\nb" and back["rank"] == 3
    assert json.loads(line)["kind"] == "error"
