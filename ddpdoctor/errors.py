"""Errors that end a command with one line on stderr and a documented exit code."""

from __future__ import annotations

from ddpdoctor.exit_codes import ExitCode


class DdpdoctorError(Exception):
    """An error the user can act on; the CLI prints `ddpdoctor: error: <message>`."""

    exit_code: ExitCode = ExitCode.INTERNAL


class UsageError(DdpdoctorError):
    """Bad flags, a missing file, a value out of range: exit code 2."""

    exit_code = ExitCode.USAGE


class InternalError(DdpdoctorError):
    exit_code = ExitCode.INTERNAL
