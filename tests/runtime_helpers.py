"""Shared by the runtime's unit tests: an active runtime recording into a fresh run directory,
and its events read back (the `world` and `recording` fixtures are in tests/unit/conftest.py)."""

from __future__ import annotations

import time

from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.runtime import activate


def start_recording(tmp_path, monkeypatch, rank: int = 0):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("DDPDOCTOR_HEARTBEAT_S", "0.05")
    runtime = activate(tmp_path / "run")
    assert runtime is not None
    return runtime


def events(runtime, kind=None):
    runtime.flush()  # hot-path events are queued for the heartbeat thread
    raw = runtime.run_dir.events_file(runtime.rank).read_bytes().split(b"\n")
    found = [e for e in (parse_event_line(line) for line in raw) if e]
    return [e for e in found if kind is None or e["kind"] == kind]


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
