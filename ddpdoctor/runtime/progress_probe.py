"""What the heartbeat says about the rank's own progress: CPU seconds, I/O bytes, the main
thread's frame.

A rank that others wait on is either busy (its CPU time advances, its stack moves, it reads or
writes data) or blocked (asleep, on a lock, a queue, a socket that stays quiet). The monitor tells
the two apart from successive heartbeats, so each one carries cheap, cumulative facts:

    cpu_s     time.process_time(): CPU seconds of every thread of this process (~1 µs)
    runq_s    seconds the main thread spent runnable but waiting for a CPU (its schedstat): on
              an overloaded machine a busy rank gets a fraction of a core, and the rest of its
              time shows here, while a blocked one has neither
    child_cpu_s  CPU seconds of the main thread's live child processes (DataLoader workers
              doing the work while the main thread waits on their queue), from /proc
    io_bytes  rchar + wchar of /proc/self/io: bytes through read()/write()-like calls, sockets
              included (a download that waits on the network still moves bytes)
    where     the user's thread's innermost frame in the user's own code, "train.py:88 evaluate"
              (the user's thread: the main thread, or the one that runs the user's code when
              the main one does not, as Ray Train's training thread; `thread` then names it)
    frame     its innermost frame of all, "socket.py:720 readinto": the same frame across beats
              with no CPU advance and no I/O, the thread has not moved (instruction offsets are
              no help: CPython rewrites them as it specializes a loop that sleeps)

All of it comes from this process, so it works for ranks on every node (multi-node runs share
only the run directory).
"""

from __future__ import annotations

import gc
import os
import sys
import sysconfig
import threading
import time
from types import FrameType
from typing import Any

_LIBRARY_ROOTS: tuple[str, ...] | None = None
_USER_FILE: dict[str, bool] = {}  # filename -> whether it is the user's code (cached)
_MAX_DEPTH = 200  # frames walked at most looking for the user's
# Ray Train's name for the thread that runs the user's training function
TRAINING_THREAD = "TrainingThread("


def _library_roots() -> tuple[str, ...]:
    """Folders whose code is not the user's: the standard library, site-packages, ddpdoctor."""
    global _LIBRARY_ROOTS
    if _LIBRARY_ROOTS is None:
        roots = set()
        for name in ("stdlib", "platstdlib", "purelib", "platlib"):
            try:
                path = sysconfig.get_paths().get(name)
            except Exception:  # noqa: BLE001
                path = None
            if path:
                roots.add(os.path.realpath(path))
        roots.add(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # ddpdoctor
        torch = sys.modules.get("torch")
        torch_file = getattr(torch, "__file__", None)
        if torch_file:
            roots.add(os.path.dirname(os.path.realpath(torch_file)))
        _LIBRARY_ROOTS = tuple(sorted(r.rstrip(os.sep) + os.sep for r in roots))
    return _LIBRARY_ROOTS


def is_user_file(filename: str) -> bool:
    known = _USER_FILE.get(filename)
    if known is None:
        if filename.startswith("<"):  # <frozen ...>, <string>
            known = False
        else:
            real = os.path.realpath(filename)
            known = not any(real.startswith(root) for root in _library_roots())
            known = known and "site-packages" not in real and "dist-packages" not in real
        if len(_USER_FILE) > 4096:
            _USER_FILE.clear()
        _USER_FILE[filename] = known
    return known


def describe_frame(frame: FrameType) -> str:
    """ "train.py:88 evaluate" (base name of the file: the line is shown to people)."""
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}"


def current_frames() -> dict[int, FrameType]:
    """`sys._current_frames()`, safe to call from a background thread.

    CPython builds its dict while holding the interpreter's thread-list lock; an allocation there
    can start a garbage collection whose finalizers need that lock again, and the thread then
    waits forever holding the GIL: the whole process hangs (CPython gh-106883, fixed in 3.11.9
    and later releases by turning the collector off for the call; on 3.11.7 it hung a
    test process so, the heartbeat in `gc_collect_main` under `_PyThread_CurrentFrames`). The
    same is done here, for those microseconds, and only if the job had the collector on."""
    if not gc.isenabled():
        return sys._current_frames()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        gc.enable()


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame of the user's own code on a thread's stack (None: none in reach)."""
    depth = 0
    while frame is not None and depth < _MAX_DEPTH:
        if is_user_file(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
        depth += 1
    return None


def user_thread(frames: dict[int, FrameType]) -> tuple[int | None, FrameType | None]:
    """(ident, innermost frame) of the thread that runs the user's code: the main thread when
    the user's code is on it (a script under torchrun or mp.spawn, an actor's method in Ray);
    else the thread that has it: Ray Train runs the training function in a thread of its own
    ("TrainingThread(...)") while the worker's main thread serves Ray. The main thread again
    when no thread has the user's code on its stack."""
    main = threading.main_thread().ident
    main_frame = frames.get(main or -1)
    if main_frame is not None and user_frame(main_frame) is not None:
        return main, main_frame
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    found: list[tuple[bool, int, FrameType]] = []
    for ident, frame in frames.items():
        if ident in (main, me) or user_frame(frame) is None:
            continue
        found.append((not names.get(ident, "").startswith(TRAINING_THREAD), ident, frame))
    if found:
        _, ident, frame = min(found, key=lambda item: item[:2])
        return ident, frame
    return main, main_frame


def main_thread_frames(frames: dict[int, FrameType] | None = None) -> dict[str, Any]:
    """where / frame of the user's thread (user_thread; empty when it cannot be seen), and its
    name when it is not the main thread."""
    try:
        ident, frame = user_thread(frames if frames is not None else current_frames())
    except Exception:  # noqa: BLE001
        return {}
    if frame is None:
        return {}
    out: dict[str, Any] = {"frame": describe_frame(frame)}
    if ident != threading.main_thread().ident:
        out["thread"] = _thread_name(ident)
    found = user_frame(frame)
    if found is not None:
        out["where"] = describe_frame(found)
    return out


def _thread_name(ident: int | None) -> str | None:
    for thread in threading.enumerate():
        if thread.ident == ident:
            return thread.name[:100]
    return None


def native_id_of(ident: int | None) -> int | None:
    for thread in threading.enumerate():
        if thread.ident == ident:
            return getattr(thread, "native_id", None)
    return None


def io_bytes() -> int | None:
    """Bytes this process passed through read/write calls (rchar + wchar), None off Linux."""
    try:
        with open("/proc/self/io", "rb") as fh:
            total = 0
            for line in fh.read().split(b"\n"):
                if line.startswith((b"rchar:", b"wchar:")):
                    total += int(line.split()[1])
            return total
    except (OSError, ValueError, IndexError):
        return None


def runq_seconds(tid: int | None = None) -> float | None:
    """Run-queue wait of a thread (default: the main thread) from /proc/self/task/<tid>/schedstat,
    None off Linux."""
    tid = tid or getattr(threading.main_thread(), "native_id", None)
    if tid is None:
        return None
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MAX_CHILDREN = 64


def children_cpu_seconds() -> float | None:
    """user + system CPU of the main thread's live children (/proc/self/task/<tid>/children),
    None where the kernel does not list them."""
    tid = getattr(threading.main_thread(), "native_id", None)
    if tid is None:
        return None
    try:
        with open(f"/proc/self/task/{tid}/children", "rb") as fh:
            pids = fh.read().split()[:MAX_CHILDREN]
    except OSError:
        return None
    total = 0
    for pid in pids:
        try:
            with open(b"/proc/" + pid + b"/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
        except (OSError, ValueError, IndexError):
            continue  # it ended between the two reads
    return total / _CLOCK_TICKS


def progress_fields() -> dict[str, Any]:
    """The heartbeat's progress facts (see the module docstring)."""
    try:
        frames = current_frames()
        ident, _ = user_thread(frames)
    except Exception:  # noqa: BLE001
        frames, ident = {}, None
    main = threading.main_thread().ident
    runq = runq_seconds(native_id_of(ident) if ident != main else None)
    fields: dict[str, Any] = {
        "cpu_s": round(time.process_time(), 4),
        "runq_s": None if runq is None else round(runq, 4),
        "io_bytes": io_bytes(),
        "child_cpu_s": children_cpu_seconds(),
    }
    fields.update(main_thread_frames(frames))
    return fields
