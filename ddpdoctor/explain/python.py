"""Python tracebacks in rank logs (the exception that ended a rank) and well-known Python errors.

Tracebacks are followed per stream — per file and per rank prefix — because torchrun --tee
interleaves the ranks' lines. The final exception of a traceback (after any "During handling of
the above exception" chain) is the finding; it is generic, so a specific explainer that recognises
its message (NCCL, gloo, DDP, c10d) replaces it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ddpdoctor.explain.lines import SourceLine
from ddpdoctor.explain.log_rules import (
    MAX_EVIDENCE,
    Candidate,
    EvidenceList,
    Groups,
    ranks_text,
    rule,
)
from ddpdoctor.findings import Finding, Severity
from ddpdoctor.protocol.torchrun_logs import signal_name

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO


def _oom_summary(groups: Groups) -> str:
    text = "CUDA ran out of GPU memory"
    if groups.get("size"):
        text += f" (tried to allocate {groups['size']})"
    return text


RULES = (
    rule(
        "python.dataloader_shm",
        ERROR,
        r"Unexpected bus error encountered in worker|DataLoader worker \(pid \d+\) is killed by "
        r"signal: Bus error",
        ["Unexpected bus error", "killed by signal: Bus error"],
        "A DataLoader worker died of a bus error: shared memory (/dev/shm) is too small or full",
        "Give the container more shared memory (`docker run --shm-size=8g` or --ipc=host; on "
        "Kubernetes an emptyDir with medium: Memory on /dev/shm), or use fewer DataLoader workers.",
        examples=(
            "ERROR: Unexpected bus error encountered in worker. This might be caused by "
            "insufficient shared memory (shm).",
            "RuntimeError: DataLoader worker (pid 46794) is killed by signal: Bus error. It is "
            "possible that dataloader's workers are out of shared memory.",
        ),
    ),
    rule(
        "python.cuda_fork",
        ERROR,
        r"Cannot re-initialize CUDA in forked subprocess",
        ["Cannot re-initialize CUDA"],
        "CUDA was initialised before a fork, and a forked child (DataLoader worker, "
        "multiprocessing) used CUDA",
        "Keep CUDA out of Dataset.__getitem__ and of anything before forking; or use the spawn "
        "start method (DataLoader(multiprocessing_context='spawn'), mp.set_start_method('spawn')).",
        examples=(
            "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
            "multiprocessing, you must use the 'spawn' start method",
        ),
    ),
    rule(
        "python.mp_bootstrap",
        ERROR,
        r"An attempt has been made to start a new process before",
        ["An attempt has been made to start a new process"],
        "A spawned process re-ran the script's top level and started processes again: the "
        "script has no `if __name__ == '__main__':` guard",
        "Put the code that starts processes (mp.spawn, DataLoader workers with spawn, "
        "start_processes) under `if __name__ == '__main__':`.",
        examples=("        An attempt has been made to start a new process before the",),
    ),
    rule(
        "python.cuda_oom",
        ERROR,
        r"CUDA out of memory(?:\. Tried to allocate (?P<size>[\d.]+ \w+))?|"
        r"torch\.(?:cuda\.)?OutOfMemoryError",
        ["CUDA out of memory", "OutOfMemoryError"],
        _oom_summary,
        "Lower the batch size or sequence length, use mixed precision or activation "
        "checkpointing; check that every rank uses its own GPU (torch.cuda.set_device) and that "
        "checkpoints load with map_location.",
        examples=(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
            "total capacity of 79.15 GiB",
        ),
    ),
    rule(
        "python.argparse_error",
        ERROR,
        # argparse's `PROG: error: MSG`, PROG being the script. Launchers and Slurm print the same
        # shape about tasks and steps ("srun: error: vm: task 1: Killed", "slurmstepd-vm: error:
        # *** STEP 7.0 ON vm CANCELLED ...") and are no command line rejected.
        r"^(?!(?:srun|salloc|sbatch|sattach|slurmstepd(?:-[^:\s]*)?|mpirun|mpiexec|prterun"
        r"|orterun|torchrun): )\S+: error: (?!unrecognized arguments:.*--local[-_]rank)"
        r"(?P<msg>.+)",
        [": error: "],
        "The script rejected its command line: {msg}",
        "Fix the arguments given to the script (after the script name in the torchrun command).",
        examples=("train.py: error: the following arguments are required: --data",),
    ),
    rule(
        "python.exception",
        ERROR,
        r"^Traceback \(most recent call last\)",
        ["Traceback (most recent call last)"],
        emits=False,
        examples=("Traceback (most recent call last):",),
    ),
)

_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
# An exception's class: capitalised, or one of the lower-case ones of the standard library
# (`socket.gaierror`, `socket.timeout`, `select.error`).
_EXCEPTION = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*|(?:[a-z]\w*)?(?:error|timeout)))(?::(?P<msg>.*))?$"
)
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
_STARTS = ("Traceback (most recent call last)", "  File ", *_CHAIN)
_NOT_MESSAGE = re.compile(r"^(?:\[?[EWIF]\d{4} |\[[EWIF] |frame #|Exception raised from )")
_MAX_MESSAGE_LINES = 12
# ddpdoctor's own wrappers (a DeepSpeed engine's or a pipeline schedule's step) are library
# frames too, also when ddpdoctor runs from a checkout rather than site-packages
_LIBRARY = ("site-packages", "dist-packages", "/lib/python3", "<frozen ", "/ddpdoctor/runtime/")
# Exceptions that are not a rank's failure: torchrun's own summary, a clean exit.
_SKIP = ("ChildFailedError", "SystemExit")
# A parent reporting that a child process died: the child's own error is the cause.
_CONSEQUENCES = ("ProcessExitedException",)
_MAX_GROUPS = 50  # distinct final exceptions kept

_Key = tuple[str | None, int | None]  # a stream: (file, rank)


@dataclass
class _Traceback:
    frame: SourceLine | None = None  # the innermost frame of user code (or any, if none)
    exception: SourceLine | None = None
    type: str = ""
    message: str = ""
    block: list[SourceLine] = field(default_factory=list)  # the exception line and its message
    cause: _Traceback | None = None
    explained: bool = False  # a specific explainer recognised the message


@dataclass
class _Group:
    """Tracebacks ending in the same exception (numbers aside): one finding for all their ranks."""

    items: list[tuple[int | None, _Traceback]] = field(default_factory=list)  # the first few
    ranks: set[int] = field(default_factory=set)


class TracebackAnalyzer:
    """`explains(line)` says whether a specific explainer recognises a line: an exception whose
    message it recognises is left to that explainer (it knows more than "a rank raised")."""

    def __init__(self, explains: Callable[[SourceLine], bool] = lambda line: False) -> None:
        self.explains = explains
        self.groups: dict[tuple[str, str], _Group] = {}
        self._open: dict[_Key, _Traceback] = {}  # being read
        self._pending: dict[_Key, _Traceback] = {}  # read; the next traceback may chain to it
        self._chained: set[_Key] = set()  # a "During handling ..." line followed the pending one

    def feed(self, line: SourceLine) -> None:
        body = line.body
        if not self._open and not body.startswith(_STARTS):
            return  # the common case: no traceback in progress, and none starting here
        key = (line.file, line.rank)
        current = self._open.get(key)
        if body.startswith("Traceback (most recent call last)"):
            if current is not None:
                self._close(key)
            self._open[key] = _Traceback(cause=self._take_pending(key))
            return
        if current is None:
            if body.startswith(_CHAIN) and key in self._pending:
                self._chained.add(key)
            elif body.startswith("  File ") and _FRAME.match(body):  # an excerpt without header
                self._take_pending(key)
                self._open[key] = _Traceback(frame=line)
            return
        if current.exception is None:
            self._frames(key, current, line)
        else:
            self._message(key, current, line)

    def _frames(self, key: _Key, current: _Traceback, line: SourceLine) -> None:
        body = line.body
        if body[:1] in (" ", "\t"):
            frame = _FRAME.match(body)
            if frame and (current.frame is None or not _is_library(frame.group("file"))):
                current.frame = line
            return
        exception = _EXCEPTION.match(body.rstrip())
        if exception is None:
            del self._open[key]  # not a traceback after all
            return
        current.exception = line
        current.type = exception.group("type")
        current.message = (exception.group("msg") or "").strip()
        current.block.append(line)

    def _message(self, key: _Key, current: _Traceback, line: SourceLine) -> None:
        body = line.body
        if body.startswith(_CHAIN):
            self._close(key)
            self._chained.add(key)
            return
        stripped = body.strip()
        if (
            (not stripped and current.message)
            or _NOT_MESSAGE.match(stripped)
            or len(current.block) >= _MAX_MESSAGE_LINES
        ):
            self._close(key)
            return
        current.block.append(line)
        if not current.message and stripped:
            current.message = stripped

    def _close(self, key: _Key) -> None:
        current = self._open.pop(key, None)
        if current is None or current.exception is None:
            return
        current.explained = any(self.explains(line) for line in current.block)
        self._take_pending(key)
        self._pending[key] = current

    def _take_pending(self, key: _Key) -> _Traceback | None:
        """The traceback read before on this stream: the cause of the next one if chained to it,
        otherwise final (recorded now)."""
        pending = self._pending.pop(key, None)
        chained = key in self._chained
        self._chained.discard(key)
        if pending is not None and not chained:
            self._record(key[1], pending)
            return None
        return pending

    def _record(self, rank: int | None, tb: _Traceback) -> None:
        if tb.explained or tb.type.rsplit(".", 1)[-1] in _SKIP:
            return
        key = (tb.type, re.sub(r"\d+", "#", tb.message)[:200])
        group = self.groups.get(key)
        if group is None:
            if len(self.groups) >= _MAX_GROUPS:
                return  # bounded: a log of endless distinct exceptions keeps the first ones
            group = self.groups[key] = _Group()
        if len(group.items) < MAX_EVIDENCE // 2:
            group.items.append((rank, tb))
        if rank is not None:
            group.ranks.add(rank)

    def end_file(self, file: str | None) -> None:
        for key in [k for k in self._open if k[0] == file]:
            self._close(key)
        for key in [k for k in self._pending if k[0] == file]:
            self._chained.discard(key)
            self._take_pending(key)

    def finish(self) -> list[Candidate]:
        for key in list(self._open):
            self._close(key)
        for key in list(self._pending):
            self._chained.discard(key)
            self._take_pending(key)
        return [_candidate(group) for group in self.groups.values()]


def _candidate(group: _Group) -> Candidate:
    evidence = EvidenceList()
    for rank, tb in group.items:
        ranks = () if rank is None else (rank,)
        if tb.cause is not None and tb.cause.exception is not None:
            evidence.add(tb.cause.exception, ranks)
        if tb.frame is not None:
            evidence.add(tb.frame, ranks)
        if tb.exception is not None:
            evidence.add(tb.exception, ranks)
    first = group.items[0][1]
    short_type = first.type.rsplit(".", 1)[-1]
    message = first.message if len(first.message) <= 300 else first.message[:300] + "…"
    who = ranks_text(group.ranks) if group.ranks else "A process"
    who = who[0].upper() + who[1:]
    where = ""
    frame = _FRAME.match(first.frame.body) if first.frame is not None else None
    if frame:
        where = f" at {frame.group('file')}:{frame.group('line')} in {frame.group('func')}"
    if short_type == "KeyboardInterrupt":
        finding = Finding(
            id="python.interrupted",
            severity=Severity.INFO,
            summary=f"{who} stopped on Ctrl-C (KeyboardInterrupt){where}",
            fix="Nothing to fix if you interrupted the job.",
            ranks=tuple(sorted(group.ranks)),
            evidence=evidence.evidence(),
        )
        return Candidate(finding)
    if short_type == "SignalException":
        # torchrun's agent raises this when it is itself stopped (Ctrl-C, a scheduler's time limit,
        # ddpdoctor stopping a hung job): the stop came from outside, the traceback is no bug.
        signal = re.search(r"got signal: (\d+)", first.message)
        name = (signal_name(-int(signal.group(1))) if signal else None) or "a signal"
        finding = Finding(
            id="torchrun.stopped",
            severity=Severity.INFO,
            summary=f"torchrun was stopped from outside by {name}; its traceback is not a bug",
            fix="Nothing to fix in the job for this line: look at why it was stopped (Ctrl-C, the "
            "scheduler's time limit, or a hang that ddpdoctor stopped) and at the ranks' own errors.",
            ranks=(),
            evidence=evidence.evidence(),
        )
        return Candidate(finding)
    finding = Finding(
        id="python.exception",
        severity=Severity.ERROR,
        summary=f"{who} raised {first.type}: {message}{where}",
        fix="This exception ended the rank: fix it where the traceback points; errors on other "
        "ranks after it are usually consequences.",
        ranks=tuple(sorted(group.ranks)),
        evidence=evidence.evidence(),
    )
    return Candidate(finding, generic=True, consequence=short_type in _CONSEQUENCES)


def _is_library(path: str) -> bool:
    return any(part in path for part in _LIBRARY)
