"""The collective smoke test: N local ranks as plain processes, every step bounded in time.

Ranks run ddpdoctor/checks/smoke_worker.py and report each step as JSON lines on a pipe of their
own. The supervisor here reads all pipes, notices a rank that errs, dies, gets wrong data or stops
answering, and kills every rank's process group at the deadline. Ranks it started are also killed
at interpreter exit (an interrupted doctor), and each rank exits on its own when the doctor is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor.checks.probes.smoke_model import (
    STEPS,
    Measurement,
    RankOutcome,
    SmokeReport,
    SmokeRequest,
)
from ddpdoctor.launchers.variables import TORCH_VARS, TORCHRUN_VARS

WORKER = Path(__file__).resolve().parent.parent / "smoke_worker.py"
# Launcher variables of the user's shell would confuse the ranks; the smoke test sets its own.
LAUNCHER_VARS = frozenset({*TORCH_VARS, *TORCHRUN_VARS})
GRACE_AFTER_FAILURE_S = 3.0  # how long the other ranks get to report their own view of a failure


class DoctorExiting(RuntimeError):
    """The smoke test was asked to start a rank after the doctor's exit began (no verdict)."""


_live: set[subprocess.Popen] = set()
# Held from a rank's fork until it is in _live, so that the doctor's exit sees every rank it started
# (a rank forked a moment before Ctrl-C would otherwise outlive it), and no rank starts after it.
_live_lock = threading.Lock()
_exiting = False


class RealSmokeProbe:
    def torch_installed(self) -> bool:
        import importlib.util

        return importlib.util.find_spec("torch") is not None

    def visible_gpus(self, env: Mapping[str, str]) -> int:
        return nvml_visible_gpus(env)

    def run(self, request: SmokeRequest) -> SmokeReport:
        return _Supervisor(request).run()


def nvml_visible_gpus(env: Mapping[str, str]) -> int:
    """GPUs NVML sees, narrowed by CUDA_VISIBLE_DEVICES (no torch import); 0 on any NVML error."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library, no GPU: all mean zero GPUs
        return 0
    mask = env.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return count
    visible = 0
    for entry in (e.strip() for e in mask.split(",")):
        if not entry or entry.startswith("-"):
            break  # CUDA stops at the first invalid entry
        visible += 1
    return min(visible, count)


@dataclass
class _Rank:
    rank: int
    proc: subprocess.Popen
    reader: Any  # the read end of this rank's report pipe (a file object)
    stderr: Any  # a temp file with the rank's stdout and stderr
    buffer: bytes = b""
    current: str | None = None  # the step it announced last
    current_since: float = 0.0
    finished: list[str] = field(default_factory=list)
    error: str | None = None
    error_step: str | None = None
    mismatch: dict[str, Any] | None = None
    failed_at: float | None = None
    eof: bool = False
    eof_at: float = 0.0
    killed: bool = False  # still running when the doctor ended it
    measurements: list[dict[str, Any]] = field(default_factory=list)


class _Supervisor:
    def __init__(self, request: SmokeRequest) -> None:
        self.request = request
        self.ranks: list[_Rank] = []
        self.selector = selectors.DefaultSelector()
        self.start = time.monotonic()
        self.stall_limit_s: float | None = None

    def run(self) -> SmokeReport:
        try:
            self._spawn()
            timed_out_step = self._supervise()
            return self._report(timed_out_step)
        finally:
            self._kill_all()
            self.selector.close()
            for rank in self.ranks:
                with contextlib.suppress(OSError):
                    rank.reader.close()
                with contextlib.suppress(OSError):
                    rank.stderr.close()

    def _spawn(self) -> None:
        port = _free_port()
        base = {k: v for k, v in self.request.env.items() if k not in LAUNCHER_VARS}
        base.setdefault("OMP_NUM_THREADS", "1")
        lifetime = self.request.timeout_s + 10.0
        for rank in range(self.request.nproc):
            read_fd, write_fd = os.pipe()
            env = {
                **base,
                "RANK": str(rank),
                "WORLD_SIZE": str(self.request.nproc),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(self.request.nproc),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "PYTHONUNBUFFERED": "1",
                "DDPDOCTOR_SMOKE_FD": str(write_fd),
                "DDPDOCTOR_SMOKE_BACKEND": self.request.backend,
                "DDPDOCTOR_SMOKE_SIZES": ",".join(str(s) for s in self.request.sizes),
                "DDPDOCTOR_SMOKE_PG_TIMEOUT": str(self.request.step_timeout_s + 10.0),
                "DDPDOCTOR_SMOKE_LIFETIME": str(lifetime),
            }
            # Closed in run() once the report has its tail; it must outlive this loop.
            stderr = tempfile.TemporaryFile()  # noqa: SIM115
            try:
                with _live_lock:
                    if _exiting:  # the doctor is exiting: a rank started now would outlive it
                        os.close(read_fd)
                        stderr.close()
                        raise DoctorExiting("the doctor is exiting: no smoke rank is started")
                    proc = subprocess.Popen(
                        [sys.executable, str(WORKER)],
                        stdin=subprocess.DEVNULL,
                        stdout=stderr,
                        stderr=stderr,
                        env=env,
                        pass_fds=(write_fd,),
                        start_new_session=True,  # its own process group, killed as a whole
                    )
                    _live.add(proc)
            finally:
                os.close(write_fd)
            reader = os.fdopen(read_fd, "rb", buffering=0)
            os.set_blocking(read_fd, False)
            state = _Rank(rank, proc, reader, stderr, current_since=time.monotonic())
            self.ranks.append(state)
            self.selector.register(reader, selectors.EVENT_READ, state)

    def _supervise(self) -> str | None:
        """Read reports until every rank is done, a failure settles, or a deadline passes.

        Returns the step that ran out of time, or None."""
        request = self.request
        while True:
            for key, _ in self.selector.select(timeout=0.1):
                self._read(key.data)
            now = time.monotonic()
            for rank in self.ranks:
                exited = rank.proc.poll() is not None and rank.eof
                if exited and rank.failed_at is None and "done" not in rank.finished:
                    rank.failed_at = rank.eof_at  # it died when its pipe closed
            if all(r.eof and r.proc.poll() is not None for r in self.ranks):
                return None
            if all("done" in r.finished for r in self.ranks):
                return None  # every rank reported success; what is left is process exit
            failures = [r.failed_at for r in self.ranks if r.failed_at is not None]
            if failures and now - min(failures) > GRACE_AFTER_FAILURE_S:
                return None
            if now - self.start > request.timeout_s:
                self.stall_limit_s = request.timeout_s
                return self._slowest_step()
            for rank in self.ranks:
                if rank.eof or rank.failed_at is not None:
                    continue
                if now - rank.current_since > self._limit(rank.current):
                    self.stall_limit_s = self._limit(rank.current)
                    return self._slowest_step()

    def _limit(self, step: str | None) -> float:
        if step in (None, "import", "init"):
            return self.request.init_timeout_s
        if step == "sweep":
            return self.request.sweep_timeout_s
        return self.request.step_timeout_s

    def _read(self, rank: _Rank) -> None:
        try:
            chunk = rank.reader.read(65536)
        except BlockingIOError:
            return
        if not chunk:
            rank.eof, rank.eof_at = True, time.monotonic()
            self.selector.unregister(rank.reader)
            return
        rank.buffer += chunk
        *lines, rank.buffer = rank.buffer.split(b"\n")
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            self._apply(rank, record)

    def _apply(self, rank: _Rank, record: dict[str, Any]) -> None:
        step, event = str(record.get("step")), record.get("event")
        now = time.monotonic()
        if event == "start":
            rank.current, rank.current_since = step, now
        elif event == "ok":
            rank.finished.append(step)
            rank.current_since = now  # waiting for the next step counts from here
        elif event == "measure":
            rank.measurements.append(record)
            rank.current_since = now
        elif event in ("error", "mismatch"):
            rank.error_step = step
            rank.error = record.get("error")
            rank.mismatch = {k: v for k, v in record.items() if k not in ("rank", "step", "t")}
            if event == "error":
                rank.mismatch = None
            rank.failed_at = now

    def _slowest_step(self) -> str:
        """The earliest step some rank had not finished when time ran out."""
        pending = [
            r.current or "import"
            for r in self.ranks
            if r.failed_at is None and (r.current or "import") not in r.finished
        ]
        return min(pending, key=STEPS.index) if pending else "done"

    def _kill_all(self) -> None:
        for rank in self.ranks:
            _terminate(rank.proc)

    def _report(self, timed_out_step: str | None) -> SmokeReport:
        elapsed = time.monotonic() - self.start
        for rank in self.ranks:
            rank.killed = rank.proc.poll() is None
        self._kill_all()  # before reading exit codes: a rank stuck at the deadline is killed here
        outcomes = []
        for rank in self.ranks:
            outcomes.append(
                RankOutcome(
                    rank=rank.rank,
                    pid=rank.proc.pid,
                    finished=tuple(rank.finished),
                    current=rank.current,
                    error=rank.error,
                    error_step=rank.error_step,
                    mismatch=rank.mismatch,
                    exit_code=rank.proc.returncode,
                    killed=rank.killed,
                    failed_at=None if rank.failed_at is None else rank.failed_at - self.start,
                    output_tail=_tail(rank.stderr),
                )
            )
        return SmokeReport(
            backend=self.request.backend,
            world_size=self.request.nproc,
            ranks=tuple(outcomes),
            measurements=_slowest_per_size(self.ranks),
            elapsed_s=elapsed,
            timed_out_step=timed_out_step,
            stall_limit_s=self.stall_limit_s if timed_out_step else None,
        )


def _slowest_per_size(ranks: list[_Rank]) -> tuple[Measurement, ...]:
    """A collective takes as long as its slowest rank: the max over ranks for each size."""
    by_size: dict[int, Measurement] = {}
    for rank in ranks:
        for m in rank.measurements:
            size, seconds = int(m["bytes"]), float(m["time_s"])
            if size not in by_size or seconds > by_size[size].time_s:
                by_size[size] = Measurement(size, seconds, int(m.get("iters", 1)))
    return tuple(by_size[s] for s in sorted(by_size))


def _terminate(proc: subprocess.Popen) -> None:
    """SIGTERM the rank's process group, then SIGKILL what is left; reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5.0)
    with _live_lock:
        _live.discard(proc)


@atexit.register
def _kill_leftovers() -> None:
    """An interrupted doctor (Ctrl-C) exits while the smoke thread still runs: end its ranks."""
    global _exiting
    with _live_lock:
        _exiting = True
        procs = list(_live)
    for proc in procs:  # every rank told first: a second Ctrl-C during the waits leaves none
        if proc.poll() is None:  # unsignalled (its group id is not reused while it is unreaped)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        _terminate(proc)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(fh: Any, limit: int = 4000) -> str:
    try:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - limit))
        return fh.read().decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return ""
