"""Bounded reading of files ddpdoctor did not write itself: a run directory's files, dumps, logs.

A run directory may come from anywhere (a copy mailed in a bug report, a shared folder another
user can write to), and so may a flight-recorder dump. Its "files" may be FIFOs (opening one for
reading blocks until a writer comes; reading one blocks until it writes), devices (/dev/zero never
ends), or symlinks to either. Every reader of such a file goes through here:

- `open_regular` opens with O_NONBLOCK (opening a FIFO returns at once) and O_NOFOLLOW (a symlink
  is not followed blindly), then fstat()s what it opened and refuses anything but a regular file.
  A symlink is followed only when `root` is given and its target stays inside `root` (a run
  directory copied with links inside it); a link out of it is refused.
- `read_bytes` reads at most `limit` bytes, and says so when the file holds more.
- `jsontext.read` parses what it reads with `jsontext.loads`, which caps nesting depth and
  refuses non-finite and absurd numbers (ddpdoctor's writers never write either).

Every refusal is an OSError (NotRegularFile) or a ValueError: what every reader already handles as
"unreadable" or "not JSON", so a crafted file costs one warning or one `ddpdoctor: error:` line.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

MAX_FILE_BYTES = 64 << 20


class NotRegularFile(OSError):
    """A path that is a FIFO, a device, a socket, a directory or a link out of its folder."""


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _flags() -> int:
    return os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | _NOFOLLOW


def open_fd(
    path: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    follow: bool = False,
) -> int:
    """A read-only descriptor on the regular file at `path`; NotRegularFile for anything else,
    never blocking (see the module's docstring). The caller closes it."""
    try:
        fd = os.open(path, _flags() & ~_NOFOLLOW if follow else _flags())
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        target = _inside(path, root)  # a symlink: followed only to a file inside `root`
        fd = os.open(target, _flags())
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"{path} is {_kind(st.st_mode)}: not read")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _inside(path: str | os.PathLike[str], root: str | os.PathLike[str] | None) -> str:
    if root is None:
        raise NotRegularFile(errno.ELOOP, f"{path} is a symlink: not followed")
    target = os.path.realpath(path)
    base = os.path.realpath(root)
    if os.path.commonpath([target, base]) != base:
        raise NotRegularFile(errno.ELOOP, f"{path} is a symlink out of {root}: not followed")
    return target


def open_regular(
    path: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    buffered: bool = False,
    follow: bool = False,
) -> BinaryIO:
    """`open_fd` as a binary file object (`with bounded.open_regular(p) as fh:`), unbuffered
    unless `buffered` (for reading line by line). `follow`: a path the user named on the
    command line may be a symlink to a regular file anywhere."""
    fd = open_fd(path, root=root, follow=follow)
    return os.fdopen(fd, "rb", buffering=-1 if buffered else 0)


def read_bytes(
    path: str | os.PathLike[str],
    limit: int = MAX_FILE_BYTES,
    *,
    root: str | os.PathLike[str] | None = None,
    whole: bool = True,
    offset: int = 0,
    follow: bool = False,
) -> bytes:
    """At most `limit` bytes of a regular file from `offset`. `whole`: the file must fit, else
    ValueError (a document cut in half is no document); otherwise its first `limit` bytes."""
    with open_regular(path, root=root, follow=follow) as fh:
        if offset:
            fh.seek(offset)
        data = read_all(fh, limit + 1 if whole else limit)
    if whole and len(data) > limit:
        raise ValueError(f"{path}: larger than {_size(limit)}: not read")
    return data


def read_all(fh: BinaryIO, limit: int) -> bytes:
    """Read until `limit` bytes or the end (a raw read may return less than asked)."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = fh.read(min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def is_regular(path: str | os.PathLike[str]) -> bool:
    """Whether `path` itself (not a link's target) is a regular file: for listings that decide
    what to read (a FIFO named like a dump is not a dump)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"


__all__ = [
    "MAX_FILE_BYTES",
    "NotRegularFile",
    "is_regular",
    "open_fd",
    "open_regular",
    "read_all",
    "read_bytes",
]
