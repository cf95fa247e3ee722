"""py-spy stacks as data: parse `py-spy dump --json`, fold library frames, group ranks by stack.

Ranks whose stacks of the user's thread (the main thread, or Ray Train's training thread) are
identical after folding form one class; the biggest class comes
first, so the odd class out — usually the culprit — stands apart. Frames read `file:line function`,
innermost last. Runs of library frames (torch, site-packages, the standard library, ddpdoctor's own
wrappers, native code) fold into one marker line, except the torch.distributed frame that names the
collective: it says where in torch a rank waits (`distributed_c10d.py:4812 barrier`), the
innermost native c10d frame when native frames were captured (`c10d::Reducer::finalize_backward`),
and, in framework code (Lightning, accelerate, transformers), the framework function the user's
frame called and the framework frame that issued the collective (`ddp.py:303 DDPStrategy.barrier`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from ddpdoctor.findings import Finding

MARKER = "…"
_STDLIB = re.compile(r"[/\\]lib[/\\]python3(?:\.\d+)?[/\\](?!site-packages|dist-packages)")
_TORCH = re.compile(r"[/\\]torch[/\\](?P<sub>[^/\\]+)?")
_PACKAGE = re.compile(r"[/\\](?:site|dist)-packages[/\\](?P<pkg>[^/\\]+)")
_OWN_WRAPPERS = re.compile(r"[/\\]ddpdoctor[/\\](?:runtime|launch)")
# Public torch.distributed calls are kept visible: the collective a rank waits in.
_COLLECTIVE_FILES = ("distributed_c10d.py",)
_MAX_LABELS = 3
# Ray Train's name for the thread that runs the user's training function
TRAINING_THREAD = "TrainingThread("


@dataclass(frozen=True)
class StackGroup:
    """Ranks whose stacks are identical (after folding library frames)."""

    ranks: tuple[int, ...]
    frames: tuple[str, ...]  # "file:line function", innermost last, library frames folded
    full_frames: tuple[str, ...] = ()  # unfolded, for the detail view
    thread: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "frames": list(self.frames), "thread": self.thread}


@dataclass(frozen=True)
class Frame:
    function: str
    file: str  # full path; for native frames the shared library
    line: int
    native: bool = False

    def label(self, *, full_path: bool = False) -> str:
        name = self.file if full_path else PurePath(self.file).name or self.file
        if self.native:
            return f"{self.function} ({name})"
        return f"{name}:{self.line} {self.function}"


@dataclass(frozen=True)
class ThreadStack:
    thread_id: int
    name: str | None
    frames: tuple[Frame, ...]  # innermost last
    os_thread_id: int | None = None
    active: bool = False
    owns_gil: bool = False
    is_main: bool = False


@dataclass(frozen=True)
class RankStacks:
    rank: int
    pid: int
    threads: tuple[ThreadStack, ...] = ()
    error: str | None = None  # why there is no stack (permission denied, process gone, timeout)
    native: bool = False  # native frames were captured
    elapsed_s: float | None = None
    denied: bool = False  # ptrace was not allowed

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def main_thread(self) -> ThreadStack | None:
        for thread in self.threads:
            if thread.is_main:
                return thread
        return self.threads[0] if self.threads else None

    @property
    def user_thread(self) -> ThreadStack | None:
        """The thread that runs the user's code: the main thread when the user's code is on it;
        else the one that has it (Ray Train's "TrainingThread(...)" first: Ray runs the training
        function there while the worker's main thread serves Ray); else the main thread."""
        main = self.main_thread
        if main is None or _has_user_frame(main):
            return main
        others = [t for t in self.threads if t is not main and _has_user_frame(t)]
        others.sort(key=lambda t: not (t.name or "").startswith(TRAINING_THREAD))
        return others[0] if others else main


@dataclass(frozen=True)
class StackCapture:
    capture_id: str
    path: str | None  # RUN_DIR/stacks/<capture_id>
    taken_t: float
    ranks: tuple[RankStacks, ...]
    findings: tuple[Finding, ...] = field(default=())

    def rank(self, rank: int) -> RankStacks | None:
        for entry in self.ranks:
            if entry.rank == rank:
                return entry
        return None

    @property
    def errors(self) -> dict[int, str]:
        return {r.rank: r.error for r in self.ranks if r.error is not None}


def parse_pyspy_dump(data: Any, pid: int) -> tuple[ThreadStack, ...]:
    """Threads from `py-spy dump --json` (frames there are innermost first; here innermost last)."""
    if not isinstance(data, list):
        raise ValueError("py-spy JSON is not a list of threads")
    threads = []
    for raw in data:
        if not isinstance(raw, Mapping):
            continue
        frames = tuple(
            _frame(f) for f in reversed(raw.get("frames") or []) if isinstance(f, Mapping)
        )
        name = raw.get("thread_name")
        os_tid = raw.get("os_thread_id")
        threads.append(
            ThreadStack(
                thread_id=int(raw.get("thread_id") or 0),
                name=name if isinstance(name, str) else None,
                frames=frames,
                os_thread_id=os_tid if isinstance(os_tid, int) else None,
                active=bool(raw.get("active")),
                owns_gil=bool(raw.get("owns_gil")),
                is_main=name == "MainThread" or (name is None and os_tid == pid),
            )
        )
    return tuple(threads)


def _frame(raw: Mapping[str, Any]) -> Frame:
    module = raw.get("module")
    return Frame(
        function=str(raw.get("name") or "?"),
        file=str(raw.get("filename") or module or "?"),
        line=int(raw.get("line") or 0),
        native=isinstance(module, str) and bool(module),
    )


def is_library_frame(frame: Frame) -> bool:
    path = frame.file
    return (
        frame.native
        or path.startswith("<frozen ")
        or "site-packages" in path
        or "dist-packages" in path
        or bool(_STDLIB.search(path))
        or bool(_TORCH.search(path))
        or bool(_OWN_WRAPPERS.search(path))
    )


def _has_user_frame(thread: ThreadStack) -> bool:
    return any(not is_library_frame(frame) for frame in thread.frames)


def names_collective(frame: Frame) -> bool:
    return (
        not frame.native
        and PurePath(frame.file).name in _COLLECTIVE_FILES
        and not frame.function.startswith("_")
    )


def innermost_c10d_frame(frames: Sequence[Frame]) -> int | None:
    """Where in native torch.distributed a rank waits (`c10d::Reducer::finalize_backward`).

    A DDP gradient all-reduce blocks in C++ under `loss.backward()`, with no distributed_c10d.py
    frame to name it; py-spy's native frames do, so the innermost c10d frame stays visible unless a
    distributed_c10d.py frame names the collective already.
    """
    found = None
    for index, frame in enumerate(frames):
        if names_collective(frame):
            return None  # the Python collective names it already
        if frame.native and "c10d::" in frame.function:
            found = index
    return found


def library_label(frame: Frame) -> str:
    """What a folded frame belongs to: torch/distributed, numpy, threading, libc.so.6, ddpdoctor."""
    path = frame.file
    if frame.native:
        return PurePath(path).name or path
    if path.startswith("<frozen "):
        return path[len("<frozen ") :].rstrip(">")
    if _OWN_WRAPPERS.search(path):
        return "ddpdoctor"
    torch = _TORCH.search(path)
    if torch:
        sub = torch.group("sub") or ""
        return "torch" if sub.endswith(".py") or not sub else f"torch/{sub}"
    package = _PACKAGE.search(path)
    if package:
        return package.group("pkg").removesuffix(".py")
    return PurePath(path).stem


def is_framework_frame(frame: Frame) -> bool:
    """A frame of a training framework or other package in site-packages (Lightning,
    accelerate, transformers, ...), not of torch, the standard library or native code."""
    if frame.native or _TORCH.search(frame.file) or _OWN_WRAPPERS.search(frame.file):
        return False
    return bool(_PACKAGE.search(frame.file))


def explaining_frames(frames: Sequence[Frame]) -> set[int]:
    """The library frames that explain a stack, kept visible when their run folds: the
    framework function a user frame called (`Trainer.fit`, `LightningModule.log`,
    `Accelerator.gather`) and the framework frame that called into torch.distributed
    (`DDPStrategy.barrier`): what the user wrote, and what issued the collective."""
    keep: set[int] = set()
    previous_user = False
    issuer: int | None = None
    for index, frame in enumerate(frames):
        library = is_library_frame(frame)
        if is_framework_frame(frame):
            if previous_user:
                keep.add(index)
            issuer = index
        elif names_collective(frame) and issuer is not None:
            keep.add(issuer)
            issuer = None
        elif not library:
            issuer = None
        previous_user = not library
    return keep


def fold_frames(frames: Sequence[Frame]) -> tuple[str, ...]:
    """Frames as lines, innermost last, with runs of library frames folded into one marker;
    the user's frames, the collective's and the framework frames that explain stay visible."""
    out: list[str] = []
    run: list[Frame] = []
    c10d_wait = innermost_c10d_frame(frames)
    keep = explaining_frames(frames)
    for index, frame in enumerate(frames):
        if (
            is_library_frame(frame)
            and not names_collective(frame)
            and index != c10d_wait
            and index not in keep
        ):
            run.append(frame)
            continue
        out.extend(_fold(run))
        run = []
        out.append(frame.label())
    out.extend(_fold(run))
    return tuple(out)


def _fold(run: list[Frame]) -> list[str]:
    if not run:
        return []
    native_only = all(frame.native for frame in run)
    labels = list(dict.fromkeys(library_label(frame) for frame in run))
    shown = ", ".join(labels[:_MAX_LABELS]) + (", …" if len(labels) > _MAX_LABELS else "")
    kind = "native" if native_only else "library"
    plural = "s" if len(run) != 1 else ""
    return [f"{MARKER} {len(run)} {kind} frame{plural} ({shown})"]


def is_marker(line: str) -> bool:
    return line.startswith(MARKER)


def group_stacks(capture: StackCapture) -> tuple[StackGroup, ...]:
    """Ranks with identical folded stacks of the user's thread (RankStacks.user_thread) in one
    class, biggest class first."""
    classes: dict[tuple[str, ...], list[tuple[int, ThreadStack]]] = {}
    for entry in capture.ranks:
        thread = entry.user_thread
        if thread is None:
            continue
        classes.setdefault(fold_frames(thread.frames), []).append((entry.rank, thread))
    groups = []
    for folded, members in classes.items():
        members.sort(key=lambda item: item[0])
        first = members[0][1]
        groups.append(
            StackGroup(
                ranks=tuple(rank for rank, _ in members),
                frames=folded,
                full_frames=tuple(f.label(full_path=True) for f in first.frames),
                thread=first.name,
            )
        )
    groups.sort(key=lambda g: (-len(g.ranks), g.ranks))
    return tuple(groups)


def thread_groups(capture: StackCapture, rank: int) -> tuple[StackGroup, ...]:
    """Every thread of one rank, folded (the detail view: heartbeat, watchdog, DataLoader ...)."""
    entry = capture.rank(rank)
    if entry is None:
        return ()
    return tuple(
        StackGroup(
            ranks=(rank,),
            frames=fold_frames(thread.frames),
            full_frames=tuple(f.label(full_path=True) for f in thread.frames),
            thread=thread.name,
        )
        for thread in entry.threads
    )


def innermost_frame(frames: Iterable[str]) -> str | None:
    """The innermost frame line that is not a folded marker: where a group's ranks are."""
    last = None
    for line in frames:
        if not is_marker(line):
            last = line
    return last
