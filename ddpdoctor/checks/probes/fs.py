"""Filesystem facts: directories, writability, small config files (each call bounded and safe)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DirStatus:
    path: str
    exists: bool
    is_dir: bool
    writable: bool
    error: str | None = None  # why it is not usable, in words ("Permission denied", ...)


class RealFsProbe:
    def dir_status(self, path: str) -> DirStatus:
        """Whether `path` is a directory this process can create files in (a real create + delete)."""
        if not os.path.exists(path):
            return DirStatus(path, exists=False, is_dir=False, writable=False, error="does not exist")
        if not os.path.isdir(path):
            return DirStatus(path, exists=True, is_dir=False, writable=False, error="not a directory")
        probe = os.path.join(path, f".ddpdoctor-write-test-{os.getpid()}")
        try:
            fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            return DirStatus(path, True, True, False, error=exc.strerror or str(exc))
        return DirStatus(path, exists=True, is_dir=True, writable=True)

    def read_text(self, path: str, limit: int = 65536) -> str | None:
        """A small text file's content, or None when it is missing or unreadable."""
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                return fh.read(limit)
        except OSError:
            return None
