"""error events from the excepthooks, and the exit event with its code."""

from __future__ import annotations

import sys
import threading

import pytest

from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.runtime import activate, deactivate
from ddpdoctor.runtime.exit_hooks import exit_code_of, user_location


@pytest.fixture
def recording(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    runtime = activate(tmp_path / "run")
    assert runtime is not None
    yield runtime
    deactivate()


def all_events(runtime):
    runtime.flush()  # hot-path events are queued for the heartbeat thread
    raw = runtime.run_dir.events_file(2).read_bytes().split(b"\n")
    return [e for e in (parse_event_line(line) for line in raw) if e]


def recorded_kinds(runtime):
    """The kinds of the events written, but the heartbeats: the fixture's heartbeat thread runs
    and may beat at any moment, after the exit event too."""
    return [e["kind"] for e in all_events(runtime) if e["kind"] != "heartbeat"]


def events(runtime, kind):
    return [e for e in all_events(runtime) if e["kind"] == kind]


def fail_deep():
    raise ValueError("bad batch shape (3, 7)")


def test_excepthook_writes_the_error_and_still_prints_it(recording, capsys):
    try:
        fail_deep()
    except ValueError:
        sys.excepthook(*sys.exc_info())
    (error,) = events(recording, "error")
    assert error["exc_type"] == "ValueError"
    assert error["message"] == "bad batch shape (3, 7)"
    assert error["fatal"] is True
    assert error["thread"] == "MainThread"
    assert 'raise ValueError("bad batch shape (3, 7)")' in error["traceback"]
    assert error["location"]["file"] == __file__
    assert error["location"]["function"] == "fail_deep"
    # the previous hook still printed the traceback, unchanged
    assert "ValueError: bad batch shape (3, 7)" in capsys.readouterr().err
    assert recording.exit_hint.code == 1 and recording.exit_hint.reason == "exception"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_thread_exceptions_are_errors_too(recording):
    def work():
        raise RuntimeError("loader thread died")

    thread = threading.Thread(target=work, name="prefetch")
    thread.start()
    thread.join()
    (error,) = events(recording, "error")
    assert (error["exc_type"], error["thread"], error["fatal"]) == (
        "RuntimeError",
        "prefetch",
        False,
    )
    assert recording.exit_hint is None  # a thread's death does not end the process


def test_exit_event_carries_the_sys_exit_code(recording):
    with pytest.raises(SystemExit):
        sys.exit(4)
    recording.write_exit_event()  # what atexit runs
    recording.emit("heartbeat", seq=99)  # nothing after the exit event
    tail = all_events(recording)[-1]
    assert (tail["kind"], tail["code"], tail["reason"], tail["rank"]) == ("exit", 4, "sys.exit", 2)
    recording.write_exit_event()
    assert len(events(recording, "exit")) == 1


def test_normal_exit_is_code_zero(recording):
    recording.write_exit_event()
    (exit_event,) = events(recording, "exit")
    assert (exit_event["code"], exit_event["reason"]) == (0, "normal")


def test_exit_flushes_the_step_in_progress(recording):
    recording.steps.on_forward(1.0, grad=True, synced=True, batch_size=8)
    recording.write_exit_event()
    kinds = recorded_kinds(recording)
    assert kinds[-2:] == ["step", "exit"]


@pytest.mark.parametrize(
    ("code", "reason", "signal"),
    [(1, "exception", None), (-15, "signal", "SIGTERM"), (3, "sys.exit", None)],
)
def test_a_process_cut_short_does_not_count_its_open_step(recording, code, reason, signal):
    """A rank whose gradient all-reduce failed because a peer was stopped dies of the exception
    (or of the stop's SIGTERM) inside its step: that step did not finish, and counting it would
    make the rank look past the collective it died in."""
    recording.steps.on_forward(1.0, grad=True, synced=True, batch_size=8)
    recording.hint_exit(code, reason, signal)
    recording.write_exit_event()
    kinds = recorded_kinds(recording)
    assert "step" not in kinds and kinds[-1] == "exit"


def test_hooks_are_restored_on_deactivate(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    before = (sys.excepthook, threading.excepthook, sys.exit)
    activate(tmp_path / "run")
    assert (sys.excepthook, threading.excepthook, sys.exit) != before
    deactivate()
    assert (sys.excepthook, threading.excepthook, sys.exit) == before


@pytest.mark.parametrize(
    ("status", "code"), [(None, 0), (0, 0), (3, 3), ("fatal: no data", 1), (True, 1)]
)
def test_exit_codes_follow_python(status, code):
    assert exit_code_of(status) == code


def test_location_skips_library_frames():
    import json

    try:
        json.loads("{broken")
    except ValueError:
        where = user_location(sys.exc_info()[2])
    assert where["file"] == __file__
    assert where["function"] == "test_location_skips_library_frames"


AT_THE_END = """
import atexit, faulthandler, sys
# registered before the runtime's: runs after them, at the very end of the exit
atexit.register(lambda: print("enabled at the end:", faulthandler.is_enabled(), flush=True))
if sys.argv[1] == "users-own":
    faulthandler.enable()
from ddpdoctor.runtime import activate
assert activate(sys.argv[2]) is not None
print("enabled while it runs:", faulthandler.is_enabled(), flush=True)
if sys.argv[1] == "exit-3":
    sys.exit(3)
"""


@pytest.mark.parametrize(
    "how, enabled_at_the_end",
    [("clean", False), ("users-own", True), ("exit-3", True)],
)
def test_ddpdoctors_faulthandler_steps_aside_after_a_clean_exit(tmp_path, how, enabled_at_the_end):
    """torch's teardown after a clean exit is the job's own: faulthandler dumping the threads in
    the middle of it could fault and turn torch's SIGABRT into a SIGSEGV. Turned off only when
    ddpdoctor enabled it, and only after a clean exit."""
    import subprocess

    from tests.procs import clean_env

    result = subprocess.run(
        [sys.executable, "-c", AT_THE_END, how, str(tmp_path / "run")],
        env=clean_env({"RANK": "0"}), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == (3 if how == "exit-3" else 0), result.stderr
    assert result.stdout.splitlines() == [
        "enabled while it runs: True",
        f"enabled at the end: {enabled_at_the_end}",
    ], result.stderr
