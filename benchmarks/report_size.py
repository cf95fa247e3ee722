"""How big and how slow `ddpdoctor report` gets on a long run of many ranks.

Writes a synthetic run directory of R ranks x S steps (the events the runtime writes: hello,
per step a collective start and end, the step, a heartbeat) and times `build_report` plus the
page and the trace, R x S against a small run of the same shape measured in the same process
(interleaved pairs: median and spread). The page and trace sizes are printed with the budget
they must stay under (report/budget.py: 20 MB and 15 s for any run).

    python benchmarks/report_size.py [--ranks 64] [--steps 3000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddpdoctor.protocol.rundir import RunDir, write_json_atomic
from ddpdoctor.report import build_report


def write_run(path: Path, ranks: int, steps: int, *, diagnosis: bool = True) -> Path:
    """`diagnosis`: with the diagnosis.json a launcher leaves (else the report diagnoses the run
    from its files first, as `watch` would: the post-mortem's cost, not the report's)."""
    run = RunDir.create(path)
    write_json_atomic(
        run.run_json, {"name": "bench", "world_size": ranks, "backend": "gloo", "hosts": ["h"]}
    )
    if diagnosis:
        write_json_atomic(
            run.diagnosis_json,
            {"schema_version": 1, "verdict": "healthy", "ranks": [], "findings": [], "final": True},
        )
    t0 = 1_700_000_000.0
    for rank in range(ranks):
        lines = [
            {"v": 1, "t": t0, "mono": 0.0, "rank": rank, "kind": "hello", "local_rank": rank,
             "world_size": ranks, "host": "h", "pid": 1000 + rank, "backend": "gloo"}
        ]  # fmt: skip
        for step in range(steps):
            t = t0 + step * 0.1
            call = {"op": "all_reduce", "seq": step + 1, "group": "default"}
            lines += [
                {"v": 1, "t": t, "mono": t - t0, "rank": rank, "kind": "collective_start", **call},
                {"v": 1, "t": t + 0.02, "mono": t - t0, "rank": rank, "kind": "collective_end",
                 **call, "ok": True},
                {"v": 1, "t": t + 0.05, "mono": t - t0, "rank": rank, "kind": "step",
                 "step": step, "epoch": 0, "loss": 1.0, "batch_size": 32, "forwards": 1,
                 "step_time_s": 0.1, "data_time_s": 0.01, "compute_time_s": 0.05,
                 "comm_wait_s": 0.02, "samples_per_s": 320.0},
            ]  # fmt: skip
            if step % 5 == 0:
                lines.append(
                    {"v": 1, "t": t + 0.06, "mono": t - t0, "rank": rank, "kind": "heartbeat",
                     "step": step}
                )  # fmt: skip
        lines.append({"v": 1, "t": t0 + steps * 0.1, "mono": 0.0, "rank": rank, "kind": "exit",
                      "code": 0})  # fmt: skip
        text = "\n".join(json.dumps(e, separators=(",", ":")) for e in lines) + "\n"
        run.events_file(rank).write_text(text)
    return run.path


def measure(path: Path) -> tuple[float, int, int, float]:
    """(wall seconds, page bytes, trace bytes, CPU seconds): on a shared machine the CPU time
    says more than the wall time."""
    start, cpu = time.perf_counter(), time.process_time()
    report = build_report(str(path))
    page = report.html()
    trace = json.dumps(report.trace())
    wall = time.perf_counter() - start
    return wall, len(page.encode()), len(trace.encode()), time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--no-diagnosis", action="store_true", help="runs without diagnosis.json (post-mortem)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        keep = not args.no_diagnosis
        big = write_run(Path(tmp) / "big", args.ranks, args.steps, diagnosis=keep)
        small = write_run(Path(tmp) / "small", 8, 300, diagnosis=keep)
        big_s, small_s, big_cpu = [], [], []
        for _ in range(args.repeats):
            small_s.append(measure(small)[0])
            seconds, page, trace, cpu = measure(big)
            big_s.append(seconds)
            big_cpu.append(cpu)
        ratios = [b / s for b, s in zip(big_s, small_s, strict=True)]
        print(f"run: {args.ranks} ranks x {args.steps} steps (baseline: 8 ranks x 300 steps)")
        print(
            f"report time: median {statistics.median(big_s):.2f} s "
            f"(spread {min(big_s):.2f}-{max(big_s):.2f}); baseline {statistics.median(small_s):.2f} s; "
            f"ratio {statistics.median(ratios):.1f}x (spread {min(ratios):.1f}-{max(ratios):.1f})"
        )
        print(f"report CPU time: median {statistics.median(big_cpu):.2f} s")
        print(f"page: {page / 1e6:.1f} MB, trace: {trace / 1e6:.1f} MB (budget: 20 MB, 15 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
