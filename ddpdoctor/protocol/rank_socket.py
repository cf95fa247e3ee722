"""A rank's word to its launcher, with the kernel as witness.

A rank's events are a file, and a file's word makes no rank (ddpdoctor.monitor.follow.vouching):
the launcher vouches for a rank by looking at the process its hello names. A process that ends
before the launcher first looks at it (a replica that lives a second on a loaded machine, a rank
killed right after it joined) leaves nothing to look at, and was refused: its death was missed,
and with it the recovery that followed.

So when the runtime learns its rank, before its hello reaches the file, it connects to its
launcher's Unix socket (`$DDPDOCTOR_RANK_SOCKET`) and sends the rank as one line. The launcher
learns the connecting process's pid from the kernel (SO_PEERCRED, taken at connect time and kept
after the process ends), never from the process: no file and no other process can say it for
that pid. The launcher reads the connections whenever it likes; a rank never waits for it (a
full backlog, a launcher starved of CPU: the rank goes on unheard).

The socket lives in a private temporary directory (0700) of the launcher's, not in the run
directory: a path there can be longer than a socket address allows, and the job may write there.
The launcher removes it when the job is over; a launcher killed with SIGKILL cannot, and its
reaper (ddpdoctor.launch.reaper) does (`remove_left_behind`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import struct
import tempfile
from pathlib import Path

ENV_RANK_SOCKET = "DDPDOCTOR_RANK_SOCKET"
MAX_LINE = 24  # "<rank>\n": a rank of up to 22 digits, anything longer is not a rank
MAX_PIDS = 1 << 16  # pids remembered, the oldest forgotten first (a word vouches a rank only
# until a later process says that rank, so an old word is of no use anyway)
MAX_PENDING = 64  # connections whose line had not come yet
MAX_ACCEPTS = 256  # connections taken per collection (a job connecting in a loop cannot hold
# the monitor's poll; the rest wait in the kernel's backlog for the next one)
PENDING_LOOKS = 20  # collections a connection may stay silent before it is dropped
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
PREFIX = "ddpdoctor-"


def say_rank(rank: int, path: str | None = None) -> bool:
    """Tell the launcher (the socket at `path`, else `$DDPDOCTOR_RANK_SOCKET`) that this
    process is rank `rank`. Never blocks and never raises; False when nobody heard."""
    target = path if path is not None else os.environ.get(ENV_RANK_SOCKET)
    if not target:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.setblocking(False)  # a full backlog fails at once instead of holding the rank
            sock.connect(target)
            sock.send(f"{int(rank)}\n".encode("ascii"))
        return True
    except (OSError, ValueError, OverflowError):
        return False


class RankSocket:
    """The launcher's end: which pid said which rank, as the kernel names the pid. A process
    can speak only for its own pid; its latest word counts (a reused pid is a new process).
    A word vouches for its rank only while it is the latest of that rank: once another
    process said the rank (a restart), the old pid's word vouches for nothing, so a hello
    naming that pid later (written into the file by anyone) is not believed."""

    def __init__(self, sock: socket.socket, directory: Path) -> None:
        self._sock = sock
        self._dir = directory
        self.path = directory / "ranks"
        self._said: dict[int, int] = {}  # pid -> its latest rank (oldest first)
        self._latest: dict[int, int] = {}  # rank -> the pid that said it last
        self._pending: list[tuple[socket.socket, int, int]] = []  # (connection, pid, looks)

    @classmethod
    def open(cls) -> RankSocket | None:
        """A listening socket in a new private directory; None when one cannot be made (the
        ranks then are vouched for as before, by looking at their processes)."""
        directory: Path | None = None
        sock: socket.socket | None = None
        try:
            directory = Path(tempfile.mkdtemp(prefix=PREFIX))
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(directory / "ranks"))
            sock.listen(socket.SOMAXCONN)
            sock.setblocking(False)
            return cls(sock, directory)
        except OSError:
            if sock is not None:
                sock.close()
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)
            return None

    def rank_of(self, pid: int) -> int | None:
        """The rank the process `pid` said it was, while no later process said that rank
        (None: it said none, not heard yet, or its rank has a newer process)."""
        self.collect()
        rank = self._said.get(pid)
        return rank if rank is not None and self._latest.get(rank) == pid else None

    def collect(self) -> None:
        """Take every connection waiting, and the lines of those heard before."""
        pending, self._pending = self._pending, []
        for conn, pid, looks in pending:
            self._read(conn, pid, looks)
        for _ in range(MAX_ACCEPTS):
            if len(self._pending) >= MAX_PENDING:
                return
            try:
                conn, _ = self._sock.accept()
            except OSError:  # none waiting (BlockingIOError), or closed
                return
            try:
                conn.setblocking(False)
                raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
                pid = _UCRED.unpack(raw)[0]
            except (OSError, struct.error):
                conn.close()
                continue
            self._read(conn, pid, 0)

    def _read(self, conn: socket.socket, pid: int, looks: int) -> None:
        try:
            data = conn.recv(MAX_LINE + 1)
        except (BlockingIOError, InterruptedError):
            if looks < PENDING_LOOKS:
                self._pending.append((conn, pid, looks + 1))
                return
            data = b""
        except OSError:
            data = b""
        conn.close()
        text = data.decode("ascii", "replace").strip()
        if pid <= 0 or not text.isdigit() or len(text) > MAX_LINE:
            return
        rank = int(text)
        self._said.pop(pid, None)  # (re-inserted: the newest last)
        self._said[pid] = rank
        self._latest[rank] = pid
        while len(self._said) > MAX_PIDS:
            old = next(iter(self._said))
            old_rank = self._said.pop(old)
            if self._latest.get(old_rank) == old:
                del self._latest[old_rank]

    @property
    def directory(self) -> Path:
        return self._dir

    def close(self) -> None:
        """Stop listening; what was said stays known (the monitor's last look may ask)."""
        self.collect()
        for conn, _, _ in self._pending:
            conn.close()
        self._pending = []
        with contextlib.suppress(OSError):
            self._sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def remove_left_behind(directory: str) -> bool:
    """Remove the directory of a rank socket whose launcher could not (it was killed): only a
    real directory of this user named like one, directly in the temporary directory, holding
    nothing but the socket. Anything else is left as it is. True when it was removed."""
    path = Path(directory)
    if not path.name.startswith(PREFIX) or path.parent != Path(tempfile.gettempdir()):
        return False
    try:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False  # (a link, a file, another user's)
        entries = os.listdir(path)
        if any(name != "ranks" for name in entries):
            return False
        if entries:
            if not stat.S_ISSOCK(os.lstat(path / "ranks").st_mode):
                return False
            os.unlink(path / "ranks")
        os.rmdir(path)
        return True
    except OSError:
        return False
