"""One rank of the doctor's collective smoke test (run as a script: stdlib and torch only).

The doctor starts N of these as plain processes with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
set. Each rank reports every step as one JSON object per line on the pipe whose descriptor is in
DDPDOCTOR_SMOKE_FD, so the doctor never parses human text:

    {"rank": 0, "step": "all_reduce", "event": "start" | "ok" | "error" | "mismatch", "t": 1.23, ...}
    {"rank": 0, "step": "sweep", "event": "measure", "bytes": 1048576, "iters": 10, "time_s": 0.0012}

Steps: import, init, barrier, all_reduce, broadcast, all_gather, sweep, done. Every collective's
result is compared element by element with what it must be: a collective that completes with wrong
data (seen with broken GPU peer-to-peer) is a failure, not a pass.

DDPDOCTOR_SMOKE_FAULT makes one rank misbehave, for ddpdoctor's own tests:
`KIND:rank=R,step=STEP` with KIND in hang (block before the step), die (exit before the step),
error (raise in the step) and wrong (corrupt one element of the step's result).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Any

START = time.monotonic()
# Run as a script, Python puts this file's directory first on sys.path, where ddpdoctor's own
# modules (system.py, network.py, ...) could shadow what torch imports: take it off.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
CHECK_ELEMENTS = 1031  # an odd count, so a result that is only right in whole blocks still shows


class Reporter:
    def __init__(self, fd: int, rank: int) -> None:
        self._out = os.fdopen(fd, "w", buffering=1, encoding="utf-8")
        self._rank = rank
        self._lock = threading.Lock()

    def send(self, step: str, event: str, **fields: object) -> None:
        record = {"rank": self._rank, "step": step, "event": event, "t": _elapsed(), **fields}
        with self._lock:
            self._out.write(json.dumps(record) + "\n")
            self._out.flush()


class Fault:
    """The test-only fault switch (DDPDOCTOR_SMOKE_FAULT), inactive unless it names this rank."""

    def __init__(self, spec: str, rank: int) -> None:
        self.kind = self.step = ""
        if not spec:
            return
        kind, _, rest = spec.partition(":")
        fields = dict(part.split("=", 1) for part in rest.split(",") if "=" in part)
        if int(fields.get("rank", "-1")) == rank:
            self.kind, self.step = kind, fields.get("step", "all_reduce")

    def before(self, step: str) -> None:
        if step != self.step:
            return
        if self.kind == "hang":
            threading.Event().wait()  # blocks for good; the doctor kills this rank at its deadline
        if self.kind == "die":
            os._exit(3)
        if self.kind == "error":
            raise RuntimeError(f"fault injected into {step}")

    def corrupts(self, step: str) -> bool:
        return self.kind == "wrong" and step == self.step


def main() -> int:
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    reporter = Reporter(int(os.environ["DDPDOCTOR_SMOKE_FD"]), rank)
    _start_guards(float(os.environ.get("DDPDOCTOR_SMOKE_LIFETIME", "120")))
    fault = Fault(os.environ.get("DDPDOCTOR_SMOKE_FAULT", ""), rank)
    step = "import"
    try:
        reporter.send(step, "start", pid=os.getpid())
        import datetime

        import torch
        import torch.distributed as dist

        reporter.send(step, "ok", torch=torch.__version__)
        backend = os.environ.get("DDPDOCTOR_SMOKE_BACKEND", "gloo")
        device = torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        timeout = datetime.timedelta(
            seconds=float(os.environ.get("DDPDOCTOR_SMOKE_PG_TIMEOUT", "60"))
        )
        checks = Collectives(torch, dist, device, rank, world, fault, reporter)

        step = "init"
        fault.before(step)
        reporter.send(step, "start")
        kwargs: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout, **kwargs)
        reporter.send(step, "ok")

        for step, run in (
            ("barrier", checks.barrier),
            ("all_reduce", checks.all_reduce),
            ("broadcast", checks.broadcast),
            ("all_gather", checks.all_gather),
            ("sweep", checks.sweep),
        ):
            fault.before(step)  # before announcing: a hung rank is one that never started the step
            reporter.send(step, "start")
            problem = run()
            if problem is not None:
                reporter.send(step, "mismatch", **problem)
                return 1
            reporter.send(step, "ok")
        step = "done"
        dist.destroy_process_group()
        reporter.send(step, "ok")
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the doctor as data
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        reporter.send(step, "error", error=last[:2000], exc_type=type(exc).__name__)
        return 1


class Collectives:
    """Each step returns None when every element is right, else where it first went wrong."""

    def __init__(self, torch, dist, device, rank, world, fault, reporter) -> None:
        self.torch, self.dist, self.device = torch, dist, device
        self.rank, self.world, self.fault, self.reporter = rank, world, fault, reporter

    def _arange(self, offset: float = 0.0):
        torch = self.torch
        return torch.arange(CHECK_ELEMENTS, dtype=torch.float64, device=self.device) + offset

    def _compare(self, step: str, got, expected) -> dict | None:
        if self.fault.corrupts(step):
            got = got.clone()
            got.view(-1)[CHECK_ELEMENTS // 2] += 1
        got, expected = got.cpu().reshape(-1), expected.cpu().reshape(-1)
        wrong = (got != expected).nonzero().reshape(-1)
        if wrong.numel() == 0:
            return None
        i = int(wrong[0])
        return {
            "index": i,
            "got": float(got[i]),
            "expected": float(expected[i]),
            "wrong_elements": int(wrong.numel()),
            "elements": int(got.numel()),
        }

    def barrier(self) -> dict | None:
        self.dist.barrier()
        return None

    def all_reduce(self) -> dict | None:
        n = CHECK_ELEMENTS
        tensor = self._arange(self.rank * n)
        self.dist.all_reduce(tensor)
        expected = self._arange() * self.world + n * (self.world * (self.world - 1) // 2)
        return self._compare("all_reduce", tensor, expected)

    def broadcast(self) -> dict | None:
        expected = self._arange() * 3 + 7
        tensor = expected.clone() if self.rank == 0 else self.torch.full_like(expected, -1.0)
        self.dist.broadcast(tensor, src=0)
        return self._compare("broadcast", tensor, expected)

    def all_gather(self) -> dict | None:
        mine = self._arange(1000.0 * self.rank)
        gathered = [self.torch.empty_like(mine) for _ in range(self.world)]
        self.dist.all_gather(gathered, mine)
        got = self.torch.cat(gathered)
        expected = self.torch.cat([self._arange(1000.0 * r) for r in range(self.world)])
        return self._compare("all_gather", got, expected)

    def sweep(self) -> dict | None:
        """all_reduce bandwidth over sizes; each size's first (warm-up) result is checked too."""
        torch, dist = self.torch, self.dist
        sizes = [int(s) for s in os.environ.get("DDPDOCTOR_SMOKE_SIZES", "1048576").split(",")]
        total = self.world * (self.world + 1) / 2
        for size in sizes:
            elements = max(2, size // 4)
            tensor = torch.full((elements,), float(self.rank + 1), device=self.device)
            dist.all_reduce(tensor)
            problem = self._compare("sweep", tensor, torch.full_like(tensor, total))
            if problem is not None:
                return {**problem, "bytes": elements * 4}
            iters = iterations_for(elements * 4)
            self._sync()
            dist.barrier()
            begin = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(tensor)
            self._sync()
            seconds = (time.perf_counter() - begin) / iters
            self.reporter.send("sweep", "measure", bytes=elements * 4, iters=iters, time_s=seconds)
        return None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)


def iterations_for(nbytes: int) -> int:
    """Timed iterations per size: many for small messages (noisy), few for large ones (slow)."""
    if nbytes <= 64 << 10:
        return 20
    if nbytes <= 1 << 20:
        return 10
    if nbytes <= 16 << 20:
        return 4
    return 2


def _start_guards(lifetime_s: float) -> None:
    """Exit on our own when the doctor is gone (killed with SIGKILL) or the lifetime runs out, so
    a rank never outlives the doctor even when the doctor could not clean up."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.25)
            if os.getppid() != parent or _elapsed() > lifetime_s:
                os._exit(4)

    threading.Thread(target=watch, name="smoke-guard", daemon=True).start()


def _elapsed() -> float:
    return round(time.monotonic() - START, 4)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip torch's slow interpreter teardown: everything was reported already
