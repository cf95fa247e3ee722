"""What ddpdoctor's in-rank instrumentation costs a training job (target: under 2% of training time).

    python benchmarks/overhead.py [--reps 5] [--steps 300] [--nproc 2] [--json] [--only b,c]
                                  [--backend gloo|nccl] [--json-out FILE]

Side by side in one run, plain and instrumented runs interleaved (the order alternates every
repetition), medians reported:

  (a) the reference job under torchrun, with the runtime active (DDPDOCTOR_RUN_DIR set, as
      `ddpdoctor run` does) and without (plain torchrun: `ddpdoctor.runtime.activate()` does nothing);
  (b) a user script, sample_jobs/healthy.py, through `-m ddpdoctor.runtime.bootstrap` and as a plain
      torchrun script: once with its small default MLP (steps of a few ms, the worst case for a
      fixed per-step cost) and once 4096 wide (steps of tens of ms, like a real job's).

  (0) the control: the same tiny-step script under plain torchrun on both sides of every pair.
      Its ratio should read 1.000; its spread is how far a pair swings on this machine with no
      instrumentation at all, the noise floor against which (b) and (c) are read.

  (c) the same tiny-step script as a user starts it, `ddpdoctor run --no-tui --no-doctor -- ...`
      (the monitor watching, DDP's buckets left to the flight recorder), against plain torchrun;
      also the CPU share of ddpdoctor's own process (launcher + monitor: its user + system time,
      read from /proc while it runs, over its wall time).

Only the training loop is measured, as the job itself reports it (after warm-up for the reference
job), never process start-up: its wall time, and rank 0's CPU time (all its threads, so the
runtime's heartbeat thread counts too). On a machine shared with other work, wall time swings with
the neighbours' load, while CPU time stays put; both are printed. The ratio is the median of each
repetition's instrumented/plain pair (runs of a pair are back to back, so they share the load).
Also printed: the events each rank writes per training step, by kind.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REFERENCE_LINE = re.compile(
    r"train loop: (\d+) steps in [\d.]+ s .*?([\d.]+) steps/s after warm-up, ([\d.]+) s of CPU"
)
SCRIPT_LINE = re.compile(r"train loop: (\d+) steps in ([\d.]+) s \(([\d.]+) s of CPU\)")
WARMUP_STEPS = 3  # the reference job's own (ddpdoctor/reference/train.py)
RETRIES = 2


@dataclass(frozen=True)
class Measurement:
    steps: int  # steps the timings cover
    wall_s: float
    cpu_s: float
    events_by_kind: dict[str, int]
    total_steps: int


def torchrun(nproc: int, program: list[str], run_dir: Path | None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPDOCTOR_", "NCCL_"))}
    env["PYTHONUNBUFFERED"] = "1"
    if run_dir is not None:
        from ddpdoctor.protocol.rundir import ENV_RUN_DIR, RunDir

        env[ENV_RUN_DIR] = str(RunDir.create(run_dir).path.resolve())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    cmd += ["--standalone", *program]
    for attempt in range(1, RETRIES + 2):
        done = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False
        )
        if done.returncode == 0:
            return done.stdout
        # A failed run measures nothing; say so and run it again rather than lose the series.
        print(f"  run failed (exit {done.returncode}, attempt {attempt}): {' '.join(cmd)}")
        print("    " + "\n    ".join(done.stderr.strip().splitlines()[-3:]), flush=True)
    raise RuntimeError(f"{' '.join(cmd)} failed {RETRIES + 1} times:\n{done.stderr[-2000:]}")


def count_events(run_dir: Path | None) -> dict[str, int]:
    if run_dir is None:
        return {}
    counts: collections.Counter[str] = collections.Counter()
    for line in (run_dir / "events" / "rank-0.jsonl").read_text().splitlines():
        try:
            counts[json.loads(line)["kind"]] += 1
        except (ValueError, KeyError):
            continue
    return dict(counts)


# The reference job's backend: gloo here, nccl on a GPU machine (scripts/gpu_check.py).
BACKEND = ["gloo"]


def measure_reference(nproc: int, steps: int, run_dir: Path | None) -> Measurement:
    program = ["-m", "ddpdoctor.reference", "--steps", str(steps), "--backend", BACKEND[0]]
    program += ["--log-every", str(steps)]
    out = torchrun(nproc, program, run_dir)
    match = REFERENCE_LINE.search(out)
    if match is None:
        raise RuntimeError(f"no training-loop line in the reference job's output:\n{out[-2000:]}")
    done, rate, cpu = int(match[1]), float(match[2]), float(match[3])
    timed = done - WARMUP_STEPS
    return Measurement(timed, timed / rate, cpu, count_events(run_dir), done)


def measure_script(
    nproc: int, steps: int, run_dir: Path | None, *, hidden: int = 128
) -> Measurement:
    script = ["sample_jobs/healthy.py", "--epochs", "100000", "--steps", str(steps)]
    script += ["--report-time", "--hidden", str(hidden), "--batch-size", "64"]
    program = ["-m", "ddpdoctor.runtime.bootstrap", *script] if run_dir is not None else script
    out = torchrun(nproc, program, run_dir)
    match = SCRIPT_LINE.search(out)
    if match is None:
        raise RuntimeError(f"no training-loop line in the script's output:\n{out[-2000:]}")
    done, wall, cpu = int(match[1]), float(match[2]), float(match[3])
    return Measurement(done, wall, cpu, count_events(run_dir), done)


def measure_under_run(
    nproc: int, steps: int, run_dir: Path | None, *, hidden: int = 128
) -> Measurement:
    """(c): the user script under `ddpdoctor run` (run_dir set) or plain torchrun (None)."""
    if run_dir is None:
        return measure_script(nproc, steps, None, hidden=hidden)
    script = ["sample_jobs/healthy.py", "--epochs", "100000", "--steps", str(steps)]
    script += ["--report-time", "--hidden", str(hidden), "--batch-size", "64"]
    cmd = [sys.executable, "-m", "ddpdoctor", "run", "--no-tui", "--no-doctor"]
    cmd += ["--nproc", str(nproc), "--backend", "gloo", "--run-dir", str(run_dir), "--", *script]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPDOCTOR_", "NCCL_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    started = time.monotonic()
    cpu = 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    samples: list[tuple[float, float]] = []  # (unix time, CPU seconds so far)
    while proc.poll() is None:
        try:  # the process's own user + system time (fields 14, 15), not its children's
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / ticks
            samples.append((time.time(), cpu))
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.2)
    wall = time.monotonic() - started
    steady = steady_share(samples, run_dir)
    if steady is not None:
        MONITOR_STEADY.append(steady)
    out = proc.stdout.read() if proc.stdout else ""
    match = SCRIPT_LINE.search(out)
    if proc.returncode != 0 or match is None:
        raise RuntimeError(f"ddpdoctor run failed ({proc.returncode}):\n{out[-2000:]}")
    MONITOR_CPU_SHARE.append(cpu / wall)
    done, loop_wall, loop_cpu = int(match[1]), float(match[2]), float(match[3])
    return Measurement(done, loop_wall, loop_cpu, count_events(run_dir), done)


def measure_plain_twice(nproc: int, steps: int, run_dir: Path | None) -> Measurement:
    """(0): plain torchrun on the "instrumented" side too (the run directory is not used)."""
    return measure_script(nproc, steps, None)


MONITOR_CPU_SHARE: list[float] = []  # (c): ddpdoctor's own process, CPU s per wall s
# (c): the same over the training loop only (steady state: start-up and the end's work left out),
# as (CPU seconds, wall seconds)
MONITOR_STEADY: list[tuple[float, float]] = []


def steady_share(samples: list[tuple[float, float]], run_dir: Path) -> tuple[float, float] | None:
    """ddpdoctor's CPU seconds and the wall seconds between rank 0's first and last step events
    (unix times in its event file), from the CPU samples taken closest inside that span."""
    try:
        lines = (run_dir / "events" / "rank-0.jsonl").read_text().splitlines()
    except OSError:
        return None
    steps = [e["t"] for e in map(json.loads, lines) if e.get("kind") == "step"]
    if len(steps) < 2:
        return None
    inside = [(t, c) for t, c in samples if steps[0] <= t <= steps[-1]]
    if len(inside) < 2 or inside[-1][0] - inside[0][0] < 1.0:
        return None
    return inside[-1][1] - inside[0][1], inside[-1][0] - inside[0][0]


def compare(
    name: str,
    measure: Callable[..., Measurement],
    *,
    nproc: int,
    steps: int,
    reps: int,
    scratch: Path,
) -> dict:
    pairs: list[tuple[Measurement, Measurement]] = []
    for rep in range(reps):
        order = ("plain", "instrumented") if rep % 2 == 0 else ("instrumented", "plain")
        got: dict[str, Measurement] = {}
        for mode in order:
            run_dir = scratch / f"{name}-{rep}".replace(" ", "-") if mode != "plain" else None
            got[mode] = measure(nproc, steps, run_dir)
        pairs.append((got["plain"], got["instrumented"]))
        plain, inst = pairs[-1]
        print(
            f"  {name} {rep + 1}/{reps}: wall {1000 * plain.wall_s / plain.steps:.2f} -> "
            f"{1000 * inst.wall_s / inst.steps:.2f} ms/step, CPU {1000 * plain.cpu_s / plain.steps:.2f}"
            f" -> {1000 * inst.cpu_s / inst.steps:.2f} ms/step",
            flush=True,
        )

    def per_step(m: Measurement, attr: str) -> float:
        return getattr(m, attr) / m.steps

    result: dict = {"name": name}
    for attr in ("wall_s", "cpu_s"):
        key = attr[:-2]
        plain_ms = statistics.median(per_step(p, attr) for p, _ in pairs) * 1000
        inst_ms = statistics.median(per_step(i, attr) for _, i in pairs) * 1000
        ratio = statistics.median(per_step(i, attr) / per_step(p, attr) for p, i in pairs)
        ratios = [per_step(i, attr) / per_step(p, attr) for p, i in pairs]
        result[key] = {
            "plain_ms_per_step": plain_ms,
            "instrumented_ms_per_step": inst_ms,
            "time_ratio": ratio,  # instrumented / plain time per step: 1.02 is 2% slower
            "overhead_pct": (ratio - 1) * 100,
            # the spread of the pairs: how far one pair can be off on this machine
            "pair_overhead_pct": [(min(ratios) - 1) * 100, (max(ratios) - 1) * 100],
        }
    kinds: collections.Counter[str] = collections.Counter()
    for _, inst in pairs:
        kinds.update(inst.events_by_kind)
    total_steps = sum(inst.total_steps for _, inst in pairs)
    result["events_per_rank_per_step"] = sum(kinds.values()) / total_steps
    result["events_by_kind_per_step"] = {k: v / total_steps for k, v in sorted(kinds.items())}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each pair")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    parser.add_argument(
        "--only", default="", metavar="CASES", help="some cases only, by name: e.g. 'b,c'"
    )
    parser.add_argument(
        "--backend", choices=("gloo", "nccl"), default="gloo", help="the reference job's, case (a)"
    )
    parser.add_argument("--json-out", type=Path, metavar="FILE", help="write the results there")
    args = parser.parse_args()
    BACKEND[0] = args.backend
    print(
        f"ddpdoctor overhead: {args.nproc} {args.backend} ranks, {args.steps} steps, {args.reps} pairs"
    )
    sides: list[tuple[str, Callable[..., Measurement]]] = [
        ("(0) control: plain torchrun against itself", measure_plain_twice),
        ("(a) reference job", measure_reference),
        ("(b) user script", measure_script),
        ("(b) user script, 4096 wide", functools.partial(measure_script, hidden=4096)),
        ("(c) user script under ddpdoctor run", measure_under_run),
    ]
    if args.only:
        wanted = {f"({c.strip()})" for c in args.only.split(",")}
        sides = [(name, m) for name, m in sides if name.split()[0] in wanted]
    results = []
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-overhead-") as tmp:
        for name, measure in sides:
            results.append(
                compare(
                    name,
                    measure,
                    nproc=args.nproc,
                    steps=args.steps,
                    reps=args.reps,
                    scratch=Path(tmp),
                )
            )
    print()
    for r in results:
        print(f"{r['name']}:")
        for key in ("wall", "cpu"):
            m = r[key]
            low, high = m["pair_overhead_pct"]
            print(
                f"    {key:4}  plain {m['plain_ms_per_step']:.2f} ms/step, instrumented "
                f"{m['instrumented_ms_per_step']:.2f} ms/step: time ratio {m['time_ratio']:.3f} "
                f"(overhead {m['overhead_pct']:+.1f}%; pairs {low:+.1f}% .. {high:+.1f}%)"
            )
        if not r["events_by_kind_per_step"]:  # the control writes no events
            continue
        kinds = ", ".join(f"{k} {v:.2f}" for k, v in r["events_by_kind_per_step"].items())
        print(f"    events per rank per step: {r['events_per_rank_per_step']:.2f} ({kinds})")
    if MONITOR_CPU_SHARE:
        shares = sorted(100 * x for x in MONITOR_CPU_SHARE)
        print(
            f"ddpdoctor run's own process (launcher + monitor): median "
            f"{statistics.median(shares):.1f}% of one core ({shares[0]:.1f} .. {shares[-1]:.1f}%)"
        )
    if MONITOR_STEADY:
        cpu_s = sum(c for c, _ in MONITOR_STEADY)
        wall_s = sum(w for _, w in MONITOR_STEADY)
        shares = sorted(100 * c / w for c, w in MONITOR_STEADY)
        print(
            f"  ... during the training loop only (steady state): {cpu_s:.2f} CPU s over "
            f"{wall_s:.1f} s = {100 * cpu_s / wall_s:.2f}% of one core (runs {shares[0]:.2f} .. "
            f"{shares[-1]:.2f}%)"
        )
    if args.json:
        print(json.dumps(results, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
