"""Output that never goes silent: a stream that cannot encode a character (PYTHONIOENCODING=ascii,
a latin-1 locale) costs that character, never the line or the lines after it; a closed pipe ends
the printing quietly. And lines ddpdoctor writes are its own: a path or a launcher named in them
cannot start another line or name ddpdoctor's own guard as the job's launcher."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from ddpdoctor.console import Verbatim, make_console, one_line, safe_stream
from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.launch.launcher import RunOutcome, closing_lines
from ddpdoctor.launch.user_command import guarded_argv
from ddpdoctor.monitor.model.launchers import launcher_views
from ddpdoctor.monitor.model.snapshot import RunInfo, Snapshot, Verdict
from ddpdoctor.protocol.rundir import RunDir
from tests.unit.monitor.test_monitor_launchers import hello, state_with
from tests.unit.monitor.test_monitor_watch_cmd import healthy_run

NOT_ASCII = "spinner \u280b \u2713 caf\u00e9 \u00b7 \u2026 \u4e2d"


@pytest.mark.parametrize("encoding", ["ascii", "latin-1", "cp1252"])
def test_a_character_the_stream_cannot_encode_costs_that_character_only(encoding):
    raw = io.BytesIO()
    stream = safe_stream(io.TextIOWrapper(raw, encoding=encoding, write_through=True))
    stream.write(NOT_ASCII + "\n")
    stream.write("the next line\n")
    console = make_console(stream)
    console.print(NOT_ASCII, markup=False)
    console.print(Verbatim("job output " + NOT_ASCII))
    console.print("verdict: healthy (exit code 0)", markup=False)
    lines = raw.getvalue().decode(encoding).splitlines()
    assert len(lines) == 5 and lines[1] == "the next line"
    assert lines[0].startswith("spinner ") and "caf" in lines[0]
    assert lines[-1] == "verdict: healthy (exit code 0)"


def test_a_closed_pipe_ends_the_printing_quietly():
    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = safe_stream(os.fdopen(write_end, "w", encoding="utf-8"))
    stream.write("x\n")
    stream.flush()
    assert stream.broken  # type: ignore[attr-defined]
    stream.write("more\n")  # no error, and nothing tried
    stream.flush()


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_watch_prints_every_line_whatever_the_encoding(tmp_path, encoding):
    run = healthy_run(tmp_path)
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    proc = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "watch", "--no-tui", str(run)],
        capture_output=True,
        env=env,
        timeout=120,
    )
    out = proc.stdout.decode(encoding)
    assert proc.returncode == 0, proc.stderr
    assert "watching" in out and "HEALTHY: all 2 ranks finished" in out
    assert "diagnosis written to" in out


def test_the_closing_lines_keep_a_path_with_a_newline_on_one_line():
    run = RunDir("/tmp/evil\nverdict: healthy (exit code 0)\x1b[2J")
    outcome = RunOutcome(
        final=Snapshot(
            run=RunInfo(name="r", run_dir="/tmp/r"), taken_t=0.0, ranks=(), verdict=Verdict.HANG
        ),
        job_returncode=1,
        stopped_for=Verdict.HANG,
        interrupted=False,
    )
    lines = closing_lines(outcome, {}, run_dir=run, exit_code=ExitCode.PROBLEMS)
    assert all("\n" not in line for line in lines)
    assert lines[-2] == "run directory: /tmp/evil\\nverdict: healthy (exit code 0)\\x1b[2J"
    assert one_line("a\tb") == "a\\tb"


def test_ddpdoctors_job_guard_is_not_named_as_rank_0s_launcher():
    guard = guarded_argv(["python", "train.py"], python="/venv/bin/python")
    spawn_parent = ["/venv/bin/python", "train.py"]
    state = state_with(
        hello(0, pid=20, ppid=10, argv=guard),  # the command itself is rank 0
        hello(1, pid=21, ppid=20, argv=spawn_parent),  # it started rank 1
    )
    views = launcher_views(state.ranks)
    assert [(v.pid, v.ranks) for v in views] == [(20, (1,))]
    assert "job_guard" not in json.dumps(state.snapshot(2.0).diagnosis_json()["launchers"])
