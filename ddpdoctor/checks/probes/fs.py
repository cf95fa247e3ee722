"""Filesystem facts: directories, writability, files, mounts, fcntl locking, free space.

Each call is one small, real operation. The fcntl lock test can block forever on NFS without lockd,
so callers bound it (ddpdoctor.checks.probes.bounded); everything else returns promptly.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass


@dataclass(frozen=True)
class DirStatus:
    path: str
    exists: bool
    is_dir: bool
    writable: bool
    error: str | None = None  # why it is not usable, in words ("Permission denied", ...)


@dataclass(frozen=True)
class FileStatus:
    path: str
    exists: bool
    is_file: bool = False
    size: int = 0
    uid: int | None = None
    mtime: float | None = None
    special: bool = False  # a device, FIFO or socket (/dev/null): neither file nor directory
    error: str | None = None  # why it could not be looked at (a name too long), other than absence


@dataclass(frozen=True)
class Mount:
    device: str
    mount_point: str
    fs_type: str
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class LockResult:
    ok: bool
    error: str | None = None


@dataclass(frozen=True)
class DiskSpace:
    path: str
    total_bytes: int
    free_bytes: int  # available to unprivileged users (f_bavail), what a job can really use


class RealFsProbe:
    def dir_status(self, path: str) -> DirStatus:
        """Whether `path` is a directory this process can create files in (a real create + delete)."""
        if not os.path.exists(path):
            return DirStatus(
                path, exists=False, is_dir=False, writable=False, error="does not exist"
            )
        if not os.path.isdir(path):
            return DirStatus(
                path, exists=True, is_dir=False, writable=False, error="not a directory"
            )
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

    def file_status(self, path: str) -> FileStatus:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return FileStatus(path, exists=False)
        except OSError as exc:
            return FileStatus(path, exists=False, error=exc.strerror or str(exc))
        is_file = not stat.S_ISDIR(st.st_mode)
        special = is_file and not stat.S_ISREG(st.st_mode)
        return FileStatus(path, True, is_file, st.st_size, st.st_uid, st.st_mtime, special)

    def mount_for(self, path: str) -> Mount | None:
        """The mount that holds `path` (its deepest existing ancestor, symlinks resolved)."""
        mounts = parse_mounts(self.read_text("/proc/mounts", limit=4 << 20) or "")
        return find_mount(mounts, os.path.realpath(_existing_ancestor(path)))

    def lock_test(self, directory: str) -> LockResult:
        """Take and release an exclusive fcntl lock on a fresh file in `directory`, as FileStore does.

        Unbounded: on NFS without a lock daemon lockf() may never return; callers bound it.
        """
        import fcntl

        probe = os.path.join(directory, f".ddpdoctor-lock-test-{os.getpid()}")
        try:
            fd = os.open(probe, os.O_CREAT | os.O_RDWR, 0o600)
        except OSError as exc:
            return LockResult(False, exc.strerror or str(exc))
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(fd, fcntl.LOCK_UN)
        except OSError as exc:
            return LockResult(False, exc.strerror or str(exc))
        finally:
            os.close(fd)
            try:
                os.unlink(probe)
            except OSError:
                pass
        return LockResult(True)

    def disk_space(self, path: str) -> DiskSpace | None:
        """statvfs() of the filesystem holding `path`; None when the path does not exist."""
        try:
            st = os.statvfs(path)
        except OSError:
            return None
        return DiskSpace(path, st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash in paths as \040, \011, \012, \134.
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> list[Mount]:
    """The lines of /proc/mounts (or /etc/mtab): device, mount point, type, options."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        options = tuple(fields[3].split(",")) if len(fields) > 3 else ()
        mounts.append(Mount(_unescape(fields[0]), _unescape(fields[1]), fields[2], options))
    return mounts


def find_mount(mounts: list[Mount], path: str) -> Mount | None:
    """The mount with the longest mount point containing `path`; the last one wins a tie
    (a later mount on the same point hides the earlier one)."""
    best: Mount | None = None
    for mount in mounts:
        point = mount.mount_point.rstrip("/") or "/"
        inside = path == point or path.startswith(point + "/") or point == "/"
        if inside and (best is None or len(point) >= len(best.mount_point.rstrip("/") or "/")):
            best = mount
    return best


def _existing_ancestor(path: str) -> str:
    current = os.path.abspath(path)
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current
