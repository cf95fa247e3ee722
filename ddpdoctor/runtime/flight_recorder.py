"""Inside a rank: answer the monitor's flight-recorder requests with this process's dump.

By default ddpdoctor leaves DDP's gradient all-reduce alone (its C++ hook, no Python per bucket):
PyTorch's flight recorder already records every collective in C++, so the bucket-level state is
read from there when the monitor needs it (a suspected hang or mismatch, the TUI's `b` key)
instead of being written as events on every step. The heartbeat thread calls `poll()` once a
beat; it costs one stat of the requests folder until a request comes (ddpdoctor.protocol
.fr_requests).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from typing import TYPE_CHECKING, Any

from ddpdoctor.protocol.flight_recorder import trim
from ddpdoctor.protocol.fr_requests import FrAnswer, scan_requests, write_answer

if TYPE_CHECKING:
    from ddpdoctor.runtime.core import Runtime

# Answered request ids remembered (requests expire within seconds; a few suffice).
MAX_ANSWERED = 64


def dump_function() -> Any:
    """A function returning this process's flight recorder as a dict, or None (no torch loaded,
    too old a torch).

    torch's pickled dump without stack traces is preferred: on 2000 gloo entries it took 76 ms
    where the JSON dump took 300-500 ms (and stack traces 14 s), on a loaded 2-core VM, mostly
    holding the GIL. The pickle is this process's own data (what fr_trace's loader reads too)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        from torch._C import _distributed_c10d as c10d
    except ImportError:
        return None
    pickled = getattr(c10d, "_dump_fr_trace", None)
    if pickled is not None:

        def from_pickle() -> Any:
            raw = pickled(includeCollectives=True, includeStackTraces=False, onlyActive=False)
            return pickle.loads(raw)

        return from_pickle
    as_json = getattr(c10d, "_dump_fr_trace_json", None)
    if as_json is None:
        return None
    return lambda: json.loads(as_json(includeCollectives=True, onlyActive=False))


def recorder_status(version: str | None = None) -> tuple[bool, str]:
    """(usable, why) for the hello event and the doctor: whether this torch can dump its flight
    recorder as JSON from inside the process (for gloo: torch 2.8 and later record gloo too)."""
    try:
        import torch
        from torch._C import _distributed_c10d as c10d
    except ImportError as exc:
        return False, f"torch.distributed is not importable ({exc})"
    version = version or torch.__version__
    if not hasattr(c10d, "_dump_fr_trace_json"):
        return False, f"torch {version} has no flight recorder JSON dump (torch >= 2.8 has)"
    size = os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
    if size is not None and size.strip() == "0":
        return False, "the flight recorder is turned off (TORCH_FR_BUFFER_SIZE=0)"
    return True, f"torch {version} records every collective (gloo and nccl) in its flight recorder"


def take_dump() -> tuple[dict[str, Any] | None, str | None]:
    """(trimmed dump, None) or (None, why not)."""
    dump = dump_function()
    if dump is None:
        return None, "this torch has no flight recorder dump"
    try:
        data = dump()
    except Exception as exc:  # noqa: BLE001 - a failed dump is an answer, not a crash
        return None, f"{type(exc).__name__}: {exc}"
    if not isinstance(data, dict):
        return None, "the flight recorder dump is not a JSON object"
    return trim(data), None


class FrResponder:
    """Answers the requests addressed to this rank, on the heartbeat thread."""

    def __init__(self, runtime: Runtime, *, clock=time.time) -> None:
        self.runtime = runtime
        self.clock = clock
        self._folder = os.fspath(runtime.run_dir.requests_dir)
        self._seen_mtime: int | None = None
        self._answered: list[str] = []
        self.answers = 0

    def poll(self) -> None:
        """One stat; a scan and an answer only when the requests folder changed."""
        rank = self.runtime.rank
        if rank is None:
            return
        try:
            mtime = os.stat(self._folder).st_mtime_ns
        except OSError:
            return
        if mtime == self._seen_mtime:
            return
        self._seen_mtime = mtime
        for request in scan_requests(self.runtime.run_dir, now=self.clock()):
            if request.id in self._answered or not request.wants(rank):
                continue
            self.answer(request.id, rank)

    def answer(self, request_id: str, rank: int) -> None:
        self._answered.append(request_id)
        del self._answered[:-MAX_ANSWERED]
        dump, error = take_dump()
        try:
            write_answer(
                self.runtime.run_dir,
                FrAnswer(
                    request_id, rank, self.clock(), dump, error, self.runtime.steps.steps_done
                ),
            )
            self.answers += 1
        except OSError:
            pass
