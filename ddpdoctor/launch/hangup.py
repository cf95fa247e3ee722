"""SIGHUP to `ddpdoctor run`: the terminal went away (an ssh session dropped, a window closed).

The policy, for every launch mode: the job is not touched. ddpdoctor detaches from the terminal
(the descriptors that were the terminal now lead to /dev/null, so nothing it prints later can
fail or block), leaves the TUI if it runs one, and watches on to the end as it would have: the
stop policy still applies, diagnosis.json is written, and the exit code is the verdict's. Only
SIGINT and SIGTERM stop a job (launcher.forward_signals); the job itself runs in a session of
its own, so the terminal's hangup never reaches it directly.

Before this, SIGHUP's default action ended ddpdoctor at once: its reaper then ended the job with
SIGTERM, and no diagnosis was written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

STANDARD_FDS = (0, 1, 2)


def _is_tty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def detach(fds: tuple[int, ...]) -> None:
    """Point `fds` at /dev/null (the terminal behind them is gone)."""
    if not fds:
        return
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    try:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.dup2(null, fd)
    finally:
        os.close(null)


class Hangup:
    """Installed while a job runs (main thread only): `happened` once SIGHUP came. While the TUI
    runs (`in_tui`), the first SIGHUP leaves it by KeyboardInterrupt, as Textual expects."""

    def __init__(self) -> None:
        self.happened = False
        self.in_tui = False
        # The terminal's descriptors, noted now: once it has hung up, isatty may say otherwise.
        self._ttys = tuple(fd for fd in STANDARD_FDS if _is_tty(fd))

    def _handler(self, _signum: int, _frame: Any) -> None:
        first = not self.happened
        self.happened = True
        detach(self._ttys)
        if first and self.in_tui:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[Hangup]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGHUP, self._handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGHUP, previous)
