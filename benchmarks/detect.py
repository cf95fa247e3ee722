"""How fast ddpdoctor names the culprit of a hang and the root cause of a crash.

Runs the reference job for real (`ddpdoctor run --no-tui --nproc 2`, torchrun, gloo) with an
injected fault, several times each, and measures from the fault to the moment the launcher prints
the verdict with the culprit:

    hang:  from rank 1's `fault` event (it stops before a collective) to "HANG: culprit rank 1"
    crash: from rank 1's `error` event (the exception) to "CRASH: culprit rank 1"

Both ends are wall-clock times on this host (event `t` and the time the line arrives on the pipe),
so the figure is independent of the monitor's own `detected_after_s`, which is printed alongside.
PyTorch's own defaults would fail the hung job after 600 s (NCCL watchdog) or 1800 s (gloo).

    python benchmarks/detect.py [--runs 5] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NCCL_DEFAULT_S = 600.0
GLOO_DEFAULT_S = 1800.0
HANG_TARGET_S = 10.0
CRASH_TARGET_S = 3.0
RUN_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Measurement:
    kind: str
    seconds: float | None  # fault -> verdict line; None when it was not seen
    detected_after_s: float | None  # what the monitor itself recorded
    culprits: list[int]
    verdict: str | None


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPDOCTOR_", "NCCL_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _event_time(run_dir: Path, rank: int, kind: str) -> float | None:
    try:
        lines = (run_dir / "events" / f"rank-{rank}.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("kind") == kind:
            return float(event["t"])
    return None


def run_once(kind: str, steps: int, step: int, base: Path, index: int) -> Measurement:
    run_dir = base / f"{kind}-{index}"
    cmd = [
        sys.executable, "-m", "ddpdoctor", "run", "--no-tui", "--no-doctor", "--nproc", "2",
        "--backend", "gloo", "--steps", str(steps), "--run-dir", str(run_dir),
        "--inject", f"{kind}:rank=1,step={step}",
    ]  # fmt: skip
    marker = f"{kind.upper()}: culprit rank 1"
    seen: list[float] = []
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=REPO,
        start_new_session=True,
    )

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not seen and line.startswith(marker):
                seen.append(time.time())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
    reader.join(timeout=5)
    start = _event_time(run_dir, 1, "fault" if kind == "hang" else "error")
    try:
        diagnosis = json.loads((run_dir / "diagnosis.json").read_text())
    except (OSError, ValueError):
        diagnosis = {}
    seconds = seen[0] - start if seen and start is not None else None
    return Measurement(
        kind,
        seconds,
        diagnosis.get("detected_after_s"),
        diagnosis.get("culprits", []),
        diagnosis.get("verdict"),
    )


def report(kind: str, results: list[Measurement], target: float) -> bool:
    times = [r.seconds for r in results if r.seconds is not None]
    right = [r for r in results if r.culprits == [1] and r.verdict == kind]
    for i, r in enumerate(results, 1):
        shown = f"{r.seconds:.2f} s" if r.seconds is not None else "not seen"
        print(
            f"  {kind} run {i}: fault -> verdict {shown}  (monitor: detected_after_s "
            f"{r.detected_after_s}, verdict {r.verdict}, culprits {r.culprits})"
        )
    if not times:
        print(f"{kind}: no verdict seen")
        return False
    median = statistics.median(times)
    print(
        f"{kind}: median {median:.2f} s over {len(times)} runs (max {max(times):.2f} s), "
        f"culprit right in {len(right)}/{len(results)}; target <= {target:g} s"
    )
    if kind == "hang":
        print(
            f"  vs PyTorch's defaults: NCCL watchdog {NCCL_DEFAULT_S:.0f} s -> "
            f"{NCCL_DEFAULT_S / median:.0f}x sooner; gloo {GLOO_DEFAULT_S:.0f} s -> "
            f"{GLOO_DEFAULT_S / median:.0f}x sooner"
        )
    return median <= target and len(right) == len(results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--step", type=int, default=8, help="the step at which the fault fires")
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-detect-") as tmp:
        for kind, target in (("hang", HANG_TARGET_S), ("crash", CRASH_TARGET_S)):
            results = [
                run_once(kind, args.steps, args.step, Path(tmp), i) for i in range(args.runs)
            ]
            ok = report(kind, results, target) and ok
    print(f"result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
