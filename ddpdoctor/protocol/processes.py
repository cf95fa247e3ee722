"""RUN_DIR/processes.jsonl: the Python processes of a `ddpdoctor run -- COMMAND` job that never
became a rank, one JSON object a line, appended as each one exits.

A process becomes a rank when it joins a process group, and only ranks write events/. A job whose
processes never join (`accelerate launch --cpu`, a script that never calls init_process_group)
would leave nothing behind, indistinguishable from a job that never started. So every process the
runtime's sitecustomize loads into, and that never joined, says so at exit:

    {"v": 1, "t": <unix time>, "pid": 123, "host": "vm", "argv": ["train.py", ...],
     "joined": false, "error": "RuntimeError: ..." | null, "engines": ["ray"]}

(`engines`: the training engines the process had imported, ENGINES, so that the advice for a job
that never formed a process group fits the engine it used.)

and a process in which the runtime could not load says why (written by the sitecustomize itself,
with the standard library only, since ddpdoctor may be what failed to import):

    {"v": 1, "t": ..., "pid": ..., "host": ..., "argv": [...], "load_error": "ModuleNotFoundError: ..."}

RUN_DIR/launcher-killed.json is written by the reaper of `ddpdoctor run` (launch/reaper.py) when
the launcher died while its job still ran (killed: SIGKILL, the OOM killer) and the reaper ended
the job: `{"v": 1, "t": <unix time>, "ended": <processes ended>}`. A watcher reads it to tell a
job stopped with its launcher from one that ended by itself.

Each line is written with one O_APPEND write (kept under 4 KiB, so lines from many processes do
not interleave). Readers read a bounded head of the file and skip what they cannot parse.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpdoctor.protocol import bounded, jsontext

# never write through a link planted in the run directory
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
FILE_NAME = "processes.jsonl"
LAUNCHER_KILLED = "launcher-killed.json"
MAX_LINE_BYTES = 4000
MAX_READ_BYTES = 256 * 1024
MAX_RECORDS = 1000
MAX_ARGV = 8
MAX_WORD = 200
# Engines whose advice differs, by their top-level module, in the order they are preferred when
# a process loaded several (Ray Train wraps Lightning and accelerate, not the other way round).
ENGINES = ("ray", "lightning", "accelerate", "deepspeed")


@dataclass(frozen=True)
class ProcessRecord:
    pid: int | None
    host: str | None
    argv: tuple[str, ...]
    error: str | None = None  # the exception that ended it, if one did
    load_error: str | None = None  # why the runtime could not load in it
    python: str | None = None  # the interpreter (sys.executable), where the record says
    engines: tuple[str, ...] = ()  # the ENGINES it had imported (known names only)


def path_in(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / FILE_NAME


def line_for(fields: dict[str, Any]) -> bytes:
    """One record as one line of at most MAX_LINE_BYTES."""
    argv = [str(w)[:MAX_WORD] for w in list(fields.get("argv") or [])[:MAX_ARGV]]
    record = {"v": 1, "t": time.time(), "pid": os.getpid(), "host": socket.gethostname()}
    record.update(fields)
    record["argv"] = argv
    for key in ("error", "load_error"):
        value = record.get(key)
        if isinstance(value, str):
            record[key] = value[:500]
    data = (json.dumps(record) + "\n").encode("utf-8", "replace")
    return data if len(data) <= MAX_LINE_BYTES else b""


def append(run_dir: str | os.PathLike[str], fields: dict[str, Any]) -> None:
    """Append one record; never raises (a process exiting must not fail on ddpdoctor's account)."""
    try:
        data = line_for(fields)
        if not data:
            return
        fd = os.open(path_in(run_dir), os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except Exception:  # noqa: BLE001
        pass


def read(run_dir: str | os.PathLike[str]) -> list[ProcessRecord]:
    """The records (bounded: the first MAX_READ_BYTES, at most MAX_RECORDS); [] when none."""
    try:
        raw = bounded.read_bytes(path_in(run_dir), MAX_READ_BYTES, whole=False)
    except OSError:
        return []
    records: list[ProcessRecord] = []
    for line in raw.split(b"\n")[:MAX_RECORDS]:
        if not line.strip() or len(line) > MAX_LINE_BYTES:
            continue
        try:
            data = jsontext.loads(line)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        pid, host, argv = data.get("pid"), data.get("host"), data.get("argv")
        records.append(
            ProcessRecord(
                pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                host=host if isinstance(host, str) else None,
                argv=tuple(str(w) for w in argv[:MAX_ARGV]) if isinstance(argv, list) else (),
                error=_text(data.get("error")),
                load_error=_text(data.get("load_error")),
                python=_text(data.get("python")),
                engines=_engines(data.get("engines")),
            )
        )
    return records


def _engines(value: Any) -> tuple[str, ...]:
    """Known engine names only, in ENGINES' order (the record is the job's file: a claim)."""
    words = value if isinstance(value, list) and len(value) <= 16 else []
    named = {w for w in words if isinstance(w, str)}
    return tuple(e for e in ENGINES if e in named)


def engines_loaded() -> list[str]:
    """The ENGINES this process imported (pytorch_lightning counts as lightning)."""
    loaded = sys.modules
    found = [e for e in ENGINES if e in loaded]
    if "pytorch_lightning" in loaded and "lightning" not in found:
        found.append("lightning")
    return found


def _text(value: Any) -> str | None:
    return value[:500] if isinstance(value, str) and value else None


def exception_text() -> str | None:
    """The exception that is ending this process (set by the interpreter before atexit runs)."""
    exc = getattr(sys, "last_value", None)
    if exc is None or isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return None
    message = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__


def say_launcher_killed(run_dir: str | os.PathLike[str], ended: int) -> None:
    """The reaper's note that it ended the job of a launcher that died (never raises)."""
    try:
        data = json.dumps({"v": 1, "t": time.time(), "ended": ended}).encode()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW
        fd = os.open(Path(run_dir) / LAUNCHER_KILLED, flags, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except Exception:  # noqa: BLE001
        pass


def launcher_was_killed(run_dir: str | os.PathLike[str]) -> bool:
    """Whether the reaper ended this run's job after its launcher died."""
    return (Path(run_dir) / LAUNCHER_KILLED).is_file()
