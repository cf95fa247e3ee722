from __future__ import annotations

import json
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpdoctor.errors import UsageError
from ddpdoctor.protocol import rundir
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
        # probes of issue 15: these crashed inside the fault code, or silently took the last key
        ("slow:rank=0,seconds=nan", "seconds must be a number from 0 to 86400"),
        ("slow:rank=0,seconds=inf", "seconds must be a number from 0 to 86400"),
        ("slow:rank=0,seconds=-inf", "seconds must be a number from 0 to 86400"),
        ("slow:rank=0,seconds=1e300", "seconds must be a number from 0 to 86400"),
        ("hang:rank=0,rank=1", "rank= is given twice"),
        ("slow:rank=0,seconds=1,seconds=2", "seconds= is given twice"),
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


def create_at_once(count: int, make: Callable[[], RunDir]) -> list[RunDir | BaseException]:
    """`make` called from `count` threads released together; each thread's RunDir or error."""
    start = threading.Barrier(count)
    results: list[RunDir | BaseException] = [RuntimeError("did not run")] * count

    def worker(i: int) -> None:
        start.wait()
        try:
            results[i] = make()
        except BaseException as exc:  # the test reports every thread's error
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_launchers_creating_one_run_dir_at_once_all_succeed(tmp_path):
    # Several nodes' launchers on a shared file system create the same RUN_DIR together; a
    # shared .write-test probe made one of them fail with "No such file or directory".
    for attempt in range(30):
        target = tmp_path / f"run-{attempt}"
        results = create_at_once(8, lambda target=target: RunDir.create(target))
        errors = [r for r in results if isinstance(r, BaseException)]
        assert errors == []
        assert {r.path for r in results} == {target}
        assert not [p.name for p in target.iterdir() if p.name.startswith(".write-test")]


def test_default_run_dirs_created_in_the_same_second_are_distinct(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    frozen = types.SimpleNamespace(
        strftime=time.strftime, localtime=time.localtime, time=lambda: 1_700_000_000.0
    )
    monkeypatch.setattr(rundir, "time", frozen)  # every run starts in the same second
    results = create_at_once(12, RunDir.create)
    paths = [r.path for r in results if isinstance(r, RunDir)]
    assert len(paths) == 12 and len(set(paths)) == 12, results
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(1_700_000_000.0))
    expected = {stamp} | {f"{stamp}-{n}" for n in range(2, 13)}
    assert {p.name for p in paths} == expected
    assert {p.parent for p in paths} == {Path(tmp_path) / "ddpdoctor-runs"}


def test_a_default_run_dir_never_reuses_an_existing_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = RunDir.create()
    (first.path / "run.json").write_text("{}")
    monkeypatch.setattr(
        rundir,
        "time",
        types.SimpleNamespace(
            strftime=lambda fmt, t: first.path.name, localtime=time.localtime, time=time.time
        ),
    )
    second = RunDir.create()
    assert second.path == first.path.with_name(f"{first.path.name}-2")


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
