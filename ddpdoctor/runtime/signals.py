"""SIGTERM: write the `exit` event (reason "signal"), then die exactly as the signal would have.

torchrun sends SIGTERM to the surviving ranks when one fails. A rank that dies of it should say
so, so the watcher can tell the victims from the rank that failed first.

The catch: a Python signal handler runs only when the main thread next executes Python code, and
a rank hung in a C++ collective never does; with a handler alone, SIGTERM would no longer kill
it. So the handler is paired with a wakeup fd (signal.set_wakeup_fd): the C-level handler writes
the signal number to a pipe at once, and a small thread reading that pipe writes the event,
restores the default action and re-raises the signal, from whichever of the two gets there first.

Only a default SIGTERM action is taken over; a handler of the user's (or SIG_IGN) is left alone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from typing import Any

from ddpdoctor.runtime import core


def reset_to_default_any_thread(signum: int) -> None:
    """signal.signal only works in the main thread; libc's signal() works from any thread."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(signum, None)  # SIG_DFL is the null pointer
    except Exception:  # noqa: BLE001 - without libc the main-thread handler still works
        pass


class SigtermGuard:
    def __init__(self, signum: int = signal.SIGTERM) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        self._fired = False
        self._recorded = threading.Event()
        self._lock = threading.Lock()
        self._read_fd: int | None = None
        self._write_fd: int | None = None
        self._installed = False

    def install(self, runtime: core.Runtime) -> bool:
        """Take over a default SIGTERM (main thread only); False when left alone."""
        if threading.current_thread() is not threading.main_thread():
            return False
        if signal.getsignal(self.signum) is not signal.SIG_DFL:
            return False
        signal.signal(self.signum, self._on_signal)
        self._installed = True
        self._start_watcher()
        runtime.on_deactivate(self.uninstall)
        return True

    def uninstall(self) -> None:
        if not self._installed:
            return
        self._installed = False
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(self.signum) == self._on_signal:
                signal.signal(self.signum, signal.SIG_DFL)
            if self._write_fd is not None:
                try:
                    current = signal.set_wakeup_fd(-1)
                    if current != self._write_fd:
                        signal.set_wakeup_fd(current)  # someone else's: put it back
                except (ValueError, OSError):
                    pass
        # Closing the write end ends the watcher (EOF); it closes the read end itself, so no
        # thread ever reads a descriptor number that was closed and handed out again.
        if self._write_fd is not None:
            try:
                os.close(self._write_fd)
            except OSError:
                pass
            self._write_fd = None
        self._read_fd = None

    def after_fork_in_child(self) -> None:
        """A forked child must not share the pipe: its signals would wake the parent's watcher."""
        if self._write_fd is not None:
            try:
                previous = signal.set_wakeup_fd(-1)
                if previous not in (-1, self._write_fd):
                    signal.set_wakeup_fd(previous)
            except (ValueError, OSError):
                pass
        for fd in (self._read_fd, self._write_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._read_fd = self._write_fd = None
        self._lock = threading.Lock()

    def _start_watcher(self) -> None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        try:
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(read_fd)
            os.close(write_fd)
            return
        if previous != -1:  # an event loop uses the wakeup fd: leave it its own
            signal.set_wakeup_fd(previous)
            os.close(read_fd)
            os.close(write_fd)
            return
        self._read_fd, self._write_fd = read_fd, write_fd
        thread = threading.Thread(
            target=self._watch, args=(read_fd,), name="ddpdoctor-signals", daemon=True
        )
        thread.start()

    def _watch(self, read_fd: int) -> None:
        while True:
            try:
                data = os.read(read_fd, 64)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data:
                try:
                    os.close(read_fd)
                except OSError:
                    pass
                return
            # the wakeup fd fires for any Python-level handler: act only while ours is installed
            # (a handler the script set later runs in the main thread, as it should)
            if self.signum in data and signal.getsignal(self.signum) == self._on_signal:
                self._die(from_main_thread=False)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._die(from_main_thread=True)

    def _die(self, *, from_main_thread: bool) -> None:
        with self._lock:
            first, self._fired = not self._fired, True
        if first:
            runtime = core.active()
            try:
                if runtime is not None:
                    runtime.hint_exit(-self.signum, "signal", self.name)
                    runtime.finish(-self.signum, "signal", signal=self.name)
            except Exception:  # noqa: BLE001 - dying matters more than the event
                pass
            finally:
                self._recorded.set()
        else:  # the other path is writing the event: let it finish (briefly) before dying
            self._recorded.wait(2.0)
        if from_main_thread:
            signal.signal(self.signum, signal.SIG_DFL)
        else:
            reset_to_default_any_thread(self.signum)
        os.kill(os.getpid(), self.signum)
