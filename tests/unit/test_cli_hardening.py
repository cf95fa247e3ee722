"""Issue 15's input probes: every numeric flag finite and in range, ports 1..65535 for `run`, no
empty paths; and ddpdoctor's own output never fails it (a closed pipe, a full disk)."""

from __future__ import annotations

import io
import os

import pytest

from ddpdoctor import cli
from ddpdoctor.console import SafeStream, make_console, tui_capable
from ddpdoctor.exit_codes import ExitCode


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["run", "--master-port", "99999"], "'99999' is not a TCP port (1 to 65535)"),
        (["run", "--master-port", "0"], "'0' is not a TCP port (1 to 65535)"),
        (["run", "--master-port", "-5"], "is not a TCP port"),
        (["run", "--run-dir", ""], "an empty path is not a directory"),
        (["run", "--run-dir", "  "], "an empty path is not a directory"),
        (["watch", ""], "an empty path is not a directory"),
        (["run", "--hang-after", "nan"], "'nan' is not a finite number"),
        (["run", "--hang-after", "inf"], "'inf' is not a finite number"),
        (["watch", "x", "--hang-after", "-1"], "must be greater than 0"),
        (["run", "--nproc", "0"], "must be at least 1"),
        (["run", "--steps", "1.5"], "is not an integer"),
        (["run", "--join-timeout", "nan"], "is not an integer"),
        (["doctor", "--distributed", "--timeout", "inf"], "is not a finite number"),
    ],
)
def test_bad_numbers_ports_and_paths_are_usage_errors(capsys, argv, words):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == ExitCode.USAGE, err
    assert out == "" and err.count("\n") == 1 and err.startswith("ddpdoctor: error: ")
    assert words in err


def test_doctor_keeps_a_bad_port_for_its_port_check():
    args = cli.parse_args(["doctor", "--master-port", "99999"])
    assert args.master_port == 99999  # reported by network.master_port, with its fix


class BrokenPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


class DiskFull(io.StringIO):
    def write(self, text):
        raise OSError(28, "No space left on device")


@pytest.mark.parametrize("stream_type", [BrokenPipe, DiskFull])
def test_a_console_whose_reader_went_away_prints_nothing_and_never_raises(stream_type):
    stream = SafeStream(stream_type())
    console = make_console(stream, width=80)
    for _ in range(3):
        console.print("a line of the job's progress")  # rich would raise SystemExit(1)
    console.file.flush()
    assert stream.broken


def test_a_broken_stdout_gives_up_on_its_descriptor_for_good(tmp_path):
    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as raw:
        stream = SafeStream(raw)
        stream.write("x" * 100_000)
        stream.flush()
        assert stream.broken
        # The descriptor now points at /dev/null: the interpreter's last flush cannot fail.
        os.write(raw.fileno(), b"more")


def test_term_dumb_gets_plain_text(monkeypatch):
    read_end, write_end = os.openpty()
    try:
        tty_out = os.fdopen(os.dup(write_end), "w")
        tty_in = os.fdopen(os.dup(read_end), "r")
        monkeypatch.setenv("TERM", "xterm-256color")
        assert tui_capable(tty_out, tty_in)
        monkeypatch.setenv("TERM", "dumb")
        assert not tui_capable(tty_out, tty_in)
        monkeypatch.delenv("TERM")
        assert not tui_capable(tty_out, tty_in)
        tty_out.close()
        tty_in.close()
    finally:
        os.close(read_end)
        os.close(write_end)
