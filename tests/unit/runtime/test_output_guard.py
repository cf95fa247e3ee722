"""A rank's print() to a log file with no room left goes to the console, never raises."""

from __future__ import annotations

import io
import os

from ddpdoctor.runtime.output_guard import GuardedStream


def test_a_write_the_file_refuses_for_lack_of_space_goes_to_the_console():
    full = os.open("/dev/full", os.O_WRONLY)  # every write: ENOSPC
    read_end, write_end = os.pipe()
    try:
        stream = GuardedStream(io.StringIO(), full, "[default1]:", write_end)
        print("step 1 loss 0.5", file=stream)  # two writes: the text, then the newline
        print("step 2", file=stream, end="")
        stream.flush()
        os.close(write_end)
        with os.fdopen(read_end, "rb") as fh:
            shown = fh.read().decode()
    finally:
        os.close(full)
    assert shown == "[default1]:step 1 loss 0.5\n[default1]:step 2"
    assert stream.diverted_writes >= 3  # every write of both prints


def test_without_a_console_the_text_is_dropped_quietly():
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        stream = GuardedStream(io.StringIO(), full, "", -1)
        assert stream.write("lost\n") == 5
        stream.flush()
    finally:
        os.close(full)


def test_a_file_with_room_gets_every_write(tmp_path):
    path = tmp_path / "stdout.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        stream = GuardedStream(io.StringIO(), fd, "[default0]:", -1)
        print("hello", file=stream)
    finally:
        os.close(fd)
    assert path.read_text() == "hello\n" and stream.diverted_writes == 0
