"""py-spy stack capture of every rank, in parallel and bounded in time.

`capture_stacks` runs `py-spy dump --json [--native] --pid PID` for each target rank at once,
stores the raw JSON under RUN_DIR/stacks/<capture-id>/rank-<R>.json plus a capture.json summary,
and returns a frozen StackCapture. A native dump that fails is retried without --native in the
time left. Without ptrace permission, or without py-spy, the capture carries a Finding that says
how to fix it. `load_capture` reads a stored capture back for post-mortems.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.rundir import (
    RunDir,
    make_private_dirs,
    write_json_atomic,
    write_text_atomic,
)
from ddpdoctor.stacks.groups import (
    RankStacks,
    StackCapture,
    group_stacks,
    parse_pyspy_dump,
    thread_groups,
)

__all__ = [
    "CommandResult",
    "PtraceFacts",
    "RankStacks",
    "StackCapture",
    "capture_stacks",
    "find_pyspy",
    "group_stacks",
    "load_capture",
    "read_ptrace_facts",
    "read_summary",
    "thread_groups",
]

SUMMARY_FILE = "capture.json"
SCHEMA_VERSION = 1
_MAX_PARALLEL = 32
_DENIED = ("permission denied", "operation not permitted")
_GONE = ("no such process", "failed to get process executable name", "no such file or directory")
_CAP_SYS_PTRACE_BIT = 19
_ONE_CAPTURE_AT_A_TIME = threading.Lock()

PTRACE_FIX = (
    "Allow ddpdoctor to ptrace the ranks: run it as root, or as the ranks' user with "
    "CAP_SYS_PTRACE (`sudo setcap cap_sys_ptrace+ep $(which py-spy)`); in Docker start the "
    "container with `--cap-add SYS_PTRACE`; where Yama restricts ptrace, `sudo sysctl -w "
    "kernel.yama.ptrace_scope=0`."
)


@dataclass(frozen=True)
class CommandResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False


Runner = Callable[[Sequence[str], float], CommandResult]


@dataclass(frozen=True)
class PtraceFacts:
    """What decides whether this process may attach to another one."""

    yama_scope: int | None  # /proc/sys/kernel/yama/ptrace_scope; None without Yama
    cap_sys_ptrace: bool
    euid: int

    def blocks_everyone(self) -> bool:
        """Attaching is impossible whatever py-spy tries (scope 3, or 2 without the capability)."""
        if self.yama_scope is None:
            return False
        return self.yama_scope >= 3 or (self.yama_scope == 2 and not self.cap_sys_ptrace)

    def explain(self) -> str:
        parts = []
        if self.yama_scope is not None:
            meaning = {
                0: "any process of the same user",
                1: "only a parent may attach",
                2: "only CAP_SYS_PTRACE may attach",
                3: "no process may attach",
            }.get(self.yama_scope, "restricted")
            parts.append(f"kernel.yama.ptrace_scope is {self.yama_scope} ({meaning})")
        parts.append(
            "this process has CAP_SYS_PTRACE" if self.cap_sys_ptrace else "no CAP_SYS_PTRACE"
        )
        parts.append(f"uid {self.euid}")
        return "; ".join(parts)


def read_ptrace_facts(proc: Path = Path("/proc")) -> PtraceFacts:
    scope: int | None = None
    with contextlib.suppress(OSError, ValueError):
        scope = int((proc / "sys/kernel/yama/ptrace_scope").read_text().strip())
    cap = False
    with contextlib.suppress(OSError, ValueError):
        for line in (proc / "self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                cap = bool(int(line.split()[1], 16) >> _CAP_SYS_PTRACE_BIT & 1)
    return PtraceFacts(yama_scope=scope, cap_sys_ptrace=cap, euid=os.geteuid())


def find_pyspy() -> str | None:
    """py-spy on PATH, or next to this Python (an unactivated virtual environment)."""
    found = shutil.which("py-spy")
    if found:
        return found
    for folder in (Path(sys.executable).parent, Path(sys.prefix) / "bin"):
        candidate = folder / "py-spy"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def run_command(cmd: Sequence[str], timeout: float) -> CommandResult:
    """Run a command with a hard time limit; on timeout its whole process group is killed."""
    proc = subprocess.Popen(
        list(cmd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=max(timeout, 0.05))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return CommandResult(None, out, err, timed_out=True)
    return CommandResult(proc.returncode, out, err)


def capture_stacks(
    run_dir: RunDir | Path | str,
    targets: Mapping[int, int],
    *,
    native: bool = True,
    timeout_s: float = 10,
    runner: Runner | None = None,
    pyspy: str | None = None,
    ptrace: PtraceFacts | None = None,
    captured_by: Mapping[str, Any] | None = None,
    request_id: str | None = None,
) -> StackCapture:
    """Dump every target rank's stacks (rank -> pid) in parallel, each within `timeout_s`.

    `captured_by` (who took it: host, pid, role, node) and `request_id` (the stack request it
    answers, or that asked other nodes for the rest: ddpdoctor.protocol.stack_requests) go into the
    capture's summary, so that the dumps of one round, taken on several nodes, belong together."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
    capture_id, folder = _new_capture_dir(run)
    taken_t = time.time()
    exe = pyspy or find_pyspy()
    facts = ptrace or read_ptrace_facts()
    if exe is None:
        ranks = tuple(
            RankStacks(r, p, error="py-spy not found") for r, p in sorted(targets.items())
        )
        findings: tuple[Finding, ...] = (_missing_finding(),)
    elif facts.blocks_everyone():
        reason = f"ptrace not allowed: {facts.explain()}"
        ranks = tuple(
            RankStacks(r, p, error=reason, denied=True) for r, p in sorted(targets.items())
        )
        findings = (_denied_finding(ranks, facts, []),)
    else:
        dumper = _Dumper(exe, runner or run_command, folder, native, timeout_s)
        # A process has one tracer at a time: a launcher that captures for its own view and
        # for another node's request at once would see one of the two dumps fail.
        with (
            _ONE_CAPTURE_AT_A_TIME,
            ThreadPoolExecutor(max_workers=max(1, min(len(targets), _MAX_PARALLEL))) as pool,
        ):
            ranks = tuple(pool.map(lambda item: dumper.dump(*item), sorted(targets.items())))
        findings = _findings(ranks, facts, dumper.denied_messages)
    capture = StackCapture(capture_id, str(folder), taken_t, ranks, findings)
    _write_summary(
        folder,
        capture,
        native=native,
        timeout_s=timeout_s,
        extra={"captured_by": dict(captured_by or {}), "request_id": request_id},
    )
    return capture


class _Dumper:
    def __init__(self, exe: str, runner: Runner, folder: Path, native: bool, timeout_s: float):
        self.exe, self.runner, self.folder = exe, runner, folder
        self.native, self.timeout_s = native, timeout_s
        self.denied_messages: list[str] = []

    def dump(self, rank: int, pid: int) -> RankStacks:
        start = time.monotonic()
        deadline = start + self.timeout_s
        attempts = [True, False] if self.native else [False]
        error, denied = "no attempt", False
        for with_native in attempts:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            cmd = [self.exe, "dump", "--json", "--pid", str(pid)]
            if with_native:
                cmd.append("--native")
            try:
                result = self.runner(cmd, left)
            except OSError as exc:  # py-spy vanished or is not executable
                return RankStacks(
                    rank, pid, error=f"cannot run py-spy: {exc}", elapsed_s=_since(start)
                )
            stacks, error, denied = self._read(rank, pid, result, with_native, start)
            if stacks is not None:
                return stacks
            if _is_gone(result):
                error = f"process {pid} not found (it exited)"
                break
            if denied or result.timed_out:
                break  # without --native it would fail the same way, or the time is spent
        if denied:
            return RankStacks(rank, pid, error=error, denied=True, elapsed_s=_since(start))
        return RankStacks(rank, pid, error=error, elapsed_s=_since(start))

    def _read(self, rank, pid, result: CommandResult, with_native: bool, start: float):
        if result.timed_out:
            return None, f"py-spy did not answer within {self.timeout_s:g} s", False
        message = _first_line(result.stderr) or _first_line(result.stdout)
        if result.returncode != 0:
            denied = any(word in result.stderr.lower() for word in _DENIED)
            if denied:
                self.denied_messages.append(message)
            return None, f"py-spy failed: {message or f'exit code {result.returncode}'}", denied
        try:
            threads = parse_pyspy_dump(json.loads(result.stdout), pid)
        except ValueError as exc:
            return None, f"py-spy printed no stack JSON ({exc})", False
        write_text_atomic(self.folder / f"rank-{rank}.json", result.stdout)
        stacks = RankStacks(rank, pid, threads, native=with_native, elapsed_s=_since(start))
        return stacks, None, False


def _is_gone(result: CommandResult) -> bool:
    text = f"{result.stderr}\n{result.stdout}".lower()
    return any(word in text for word in _GONE)


def _since(start: float) -> float:
    return round(time.monotonic() - start, 3)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _new_capture_dir(run: RunDir) -> tuple[str, Path]:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        capture_id = stamp if n == 1 else f"{stamp}-{n}"
        folder = run.stacks_dir / capture_id
        make_private_dirs(run.stacks_dir)
        try:
            folder.mkdir(0o700)
        except FileExistsError:
            continue
        return capture_id, folder
    raise RuntimeError(f"cannot create a capture folder under {run.stacks_dir}")


def _findings(
    ranks: tuple[RankStacks, ...], facts: PtraceFacts, denied_messages: list[str]
) -> tuple[Finding, ...]:
    out = []
    if any(r.denied for r in ranks):
        out.append(_denied_finding(ranks, facts, denied_messages))
    failed = [r for r in ranks if r.error is not None and not r.denied]
    if failed:
        out.append(
            Finding(
                id="stacks.capture_failed",
                severity=Severity.WARNING,
                summary="No stack for "
                + "; ".join(f"rank {r.rank} (pid {r.pid}): {r.error}" for r in failed),
                fix="A rank that exited has no stack to take; for a timeout, retry the capture "
                "(py-spy pauses each process briefly) or capture without --native.",
                ranks=tuple(r.rank for r in failed),
            )
        )
    return tuple(out)


def _denied_finding(
    ranks: Sequence[RankStacks], facts: PtraceFacts, messages: list[str]
) -> Finding:
    denied = [r.rank for r in ranks if r.denied]
    said = f" (py-spy: {messages[0]})" if messages else ""
    return Finding(
        id="stacks.ptrace_denied",
        severity=Severity.WARNING,
        summary=f"py-spy may not attach to rank(s) {', '.join(map(str, denied))}: ptrace is not "
        f"allowed here — {facts.explain()}{said}",
        fix=PTRACE_FIX,
        ranks=tuple(denied),
    )


def _missing_finding() -> Finding:
    return Finding(
        id="stacks.pyspy_missing",
        severity=Severity.WARNING,
        summary="py-spy is not installed, so the ranks' stacks cannot be captured",
        fix="`pip install py-spy` in the environment that runs ddpdoctor (it must be on PATH or "
        "next to that Python).",
    )


def _write_summary(
    folder: Path,
    capture: StackCapture,
    *,
    native: bool,
    timeout_s: float,
    extra: Mapping[str, Any] | None = None,
) -> None:
    write_json_atomic(
        folder / SUMMARY_FILE,
        {
            "schema_version": SCHEMA_VERSION,
            **(extra or {}),
            "capture_id": capture.capture_id,
            "taken_t": capture.taken_t,
            "native": native,
            "timeout_s": timeout_s,
            "ranks": [
                {
                    "rank": r.rank,
                    "pid": r.pid,
                    "ok": r.ok,
                    "error": r.error,
                    "denied": r.denied,
                    "native": r.native,
                    "elapsed_s": r.elapsed_s,
                    "threads": len(r.threads),
                }
                for r in capture.ranks
            ],
            "findings": [f.to_json() for f in capture.findings],
        },
    )


def read_summary(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """A capture's capture.json ({} when missing or unreadable)."""
    try:
        data = jsontext.read(Path(folder) / SUMMARY_FILE)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_capture(folder: str | os.PathLike[str]) -> StackCapture:
    """A stored capture (RUN_DIR/stacks/<id>), for post-mortems and copied run directories."""
    path = Path(folder)
    try:
        summary = jsontext.read(path / SUMMARY_FILE)
    except (OSError, ValueError):
        summary = {}
    entries = summary.get("ranks") if isinstance(summary, dict) else None
    if not entries:  # no summary: every rank-<R>.json there is a successful dump
        entries = [
            {"rank": int(p.stem.split("-", 1)[1]), "pid": 0}
            for p in sorted(path.glob("rank-*.json"))
            if p.stem.split("-", 1)[1].isdigit()
        ]
    ranks = []
    for entry in entries:
        rank, pid = int(entry["rank"]), int(entry.get("pid") or 0)
        dump = path / f"rank-{rank}.json"
        if dump.is_file():
            try:
                data = jsontext.read(dump)
                pid = pid or _pid_in_dump(data)
                threads = parse_pyspy_dump(data, pid)
            except (OSError, ValueError) as exc:
                ranks.append(RankStacks(rank, pid, error=f"unreadable dump: {exc}"))
                continue
            ranks.append(RankStacks(rank, pid, threads, native=bool(entry.get("native"))))
        else:
            error = entry.get("error") or "no dump stored"
            ranks.append(RankStacks(rank, pid, error=error, denied=bool(entry.get("denied"))))
    findings = tuple(
        Finding.from_json(f) for f in summary.get("findings", ()) if isinstance(f, dict)
    )
    return StackCapture(
        capture_id=str(summary.get("capture_id") or path.name),
        path=str(path),
        taken_t=float(summary.get("taken_t") or path.stat().st_mtime),
        ranks=tuple(sorted(ranks, key=lambda r: r.rank)),
        findings=findings,
    )


def _pid_in_dump(data: object) -> int:
    if isinstance(data, list) and data and isinstance(data[0], dict):
        pid = data[0].get("pid")
        return pid if isinstance(pid, int) else 0
    return 0
