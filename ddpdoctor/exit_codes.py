"""The exit-code contract shared by every command (documented in the README)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # nothing wrong (warnings allowed unless --strict)
    PROBLEMS = 1  # a failed check, a job that hung or crashed
    USAGE = 2  # bad command line or bad input file
    INTERNAL = 3  # ddpdoctor itself broke
    INTERRUPTED = 130  # Ctrl-C / SIGINT
