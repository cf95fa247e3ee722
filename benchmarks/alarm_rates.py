"""The figures nobody publishes: false alarms per job-hour of healthy runs and detection latency per
fault class, on a quiet and on a loaded machine, beside what a user has without ddpdoctor.

    python benchmarks/alarm_rates.py [--runs 1] [--parallel 2] [--load 0,2] [--only NAME]...
                                     [--watchdog] [--set healthy|faulty|both]

The jobs are corpus_jobs.py's, as false_alarms.py runs them (the whole corpus: the run corpus,
the frameworks, FSDP2, pipelines, Ray, DeepSpeed, the mismatch corpus, the replica corpus (any
`replicas.*` finding on a healthy job is a false alarm), recoveries and torchft, the broken samples
and the reference job's injected faults; `--only ds- --only mismatch- --only replica-` picks
corpora by their names' prefix), run the same way (`ddpdoctor run --no-tui --no-doctor --json`, torchrun, gloo, the
adaptive hang threshold). `--load` lists machine loads to run the sets under, one pass each:
0 is the machine as it is; N starts N processes that spin on a core for the whole pass (killed at
its end), so the ranks, the watcher and the heartbeats all compete for the CPU.

Reported per load:
- false alarms per job-hour: alarms over the healthy runs' summed wall time (the hours measured
  are printed; with no alarm the figure is an upper bound, "< 1 per H job-hours");
- detection latency per fault class (the expected verdict: hang, crash, mismatch): p50, p90 and
  max of the monitor's `detected_after_s` over the right detections, and how many were right.

`--watchdog` adds, in the same run, what the user has without ddpdoctor for a hang: a 2-rank gloo
job under plain torchrun whose rank 1 stops before its 8th step, with TorchTitan's settings
(`init_timeout_seconds` 300 until the first step, then `train_timeout_seconds` 100 set on the
group with `_set_pg_timeout`): the seconds from the stop to the job's end, measured. torch's
defaults (NCCL 600 s, gloo 1800 s) are that long by construction and are printed beside it, not
waited for; so is Ray Train's hang detector (its NCCL RAS callback, NCCL only: its confirmation
time and poll, read from the installed Ray). The ratios of each to ddpdoctor's median hang
latency are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import false_alarms

TORCH_DEFAULTS_S = {"NCCL": 600.0, "gloo": 1800.0}
TITAN_TRAIN_TIMEOUT_S = 100
WATCHDOG_RUN_TIMEOUT_S = 400.0

# A hang as a TorchTitan-configured job meets it: rank 1 stops before step 8.
WATCHDOG_JOB = textwrap.dedent(
    """
    import os, sys, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    from torch.distributed.distributed_c10d import _set_pg_timeout
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    for step in range(1, 50):
        if step == 2:  # TorchTitan: the train timeout once the first step is done
            _set_pg_timeout(timedelta(seconds=int(sys.argv[1])), dist.group.WORLD)
        if rank == 1 and step == 8:
            print(f"STOPPED {time.time()}", flush=True)
            time.sleep(3600)
        model(torch.randn(8, 64)).sum().backward()
    dist.destroy_process_group()
    """
)


@contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """`count` processes spinning on a core until the block ends (bounded: they die with it)."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import time\nend = time.time() + 7200\nwhile time.time() < end: pass",
            ],
            start_new_session=True,
        )
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def per_job_hour(healthy: Sequence[false_alarms.Outcome]) -> list[str]:
    timed_out = [o for o in healthy if o.timed_out]  # no verdict: their hours are not counted
    hours = sum(o.wall_s for o in healthy if not o.timed_out) / 3600.0
    alarms = [o for o in healthy if o.false_alarm]
    if hours <= 0:
        return ["false alarms per job-hour: no healthy run"]
    rate = (
        f"{len(alarms) / hours:.2f} per job-hour"
        if alarms
        else f"0 (< 1 per {hours:.2f} job-hours)"
    )
    lines = [
        f"healthy: {len(healthy)} runs, {hours:.2f} job-hours, {len(alarms)} false alarms: {rate}"
    ]
    if alarms:
        lines.append("  alarmed: " + ", ".join(sorted({o.job.name for o in alarms})))
    if timed_out:
        lines.append(
            "  timed out (no verdict): " + ", ".join(sorted({o.job.name for o in timed_out}))
        )
    return lines


def latency_table(faulty: Sequence[false_alarms.Outcome]) -> list[str]:
    lines = ["fault class   right    p50      p90      max"]
    classes = sorted({v for o in faulty for v in o.job.verdicts})
    for kind in classes:
        runs = [o for o in faulty if kind in o.job.verdicts and len(o.job.verdicts) == 1]
        runs += [o for o in faulty if len(o.job.verdicts) > 1 and o.verdict == kind]
        right = [o for o in runs if o.right]
        times = [o.detected_after_s for o in right if o.detected_after_s is not None]
        if not runs:
            continue
        if times:
            cells = " ".join(f"{f'{v:.1f} s':<8}" for v in (
                statistics.median(times), percentile(times, 0.9), max(times)
            ))  # fmt: skip
        else:
            cells = "-"
        lines.append(f"{kind:<13} {len(right)}/{len(runs):<6} {cells}")
    wrong = sorted({o.job.name for o in faulty if not o.right})
    if wrong:
        lines.append("wrong: " + ", ".join(wrong))
    return lines


def watchdog_hang(base: Path, train_timeout_s: int) -> float | None:
    """Seconds from rank 1's stop to the end of a plain torchrun job with TorchTitan's timeout."""
    script = base / "watchdog_job.py"
    script.write_text(WATCHDOG_JOB)
    port = false_alarms_free_port()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(port), str(script), str(train_timeout_s),
    ]  # fmt: skip
    out = base / "watchdog.out"
    with open(out, "w") as sink:
        proc = subprocess.Popen(
            cmd, stdout=sink, stderr=subprocess.STDOUT, env=false_alarms._env(),
            start_new_session=True,
        )  # fmt: skip
        try:
            proc.wait(timeout=WATCHDOG_RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            false_alarms._kill(proc)
            return None
    ended = time.time()
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith("STOPPED "):
            return ended - float(line.split()[1])
    return None


def ray_train_hang_detector() -> tuple[str, float] | None:
    """(how the installed Ray Train's hang detector is set by default, the seconds before it
    says a hang), read from the installed Ray's own constants: its NCCL RAS callback, off unless
    RAY_TRAIN_ENABLE_NCCL_HANG_DETECTOR=1, polls every 15 s and confirms a hang once a
    communicator made no progress for 600 s (Ray 2.60). It queries NCCL's RAS, so it does not
    apply to these gloo jobs: the figure is its own by construction, not a measurement. None
    without Ray, or a Ray without it."""
    try:
        import ray
        from ray.train.v2._internal import constants
    except ImportError:
        return None
    confirm = getattr(constants, "DEFAULT_NCCL_RAS_CONFIRM_DURATION_S", None)
    poll = getattr(constants, "DEFAULT_NCCL_RAS_MIN_POLL_INTERVAL_S", None)
    action = getattr(constants, "DEFAULT_NCCL_RAS_ACTION", "?")
    if not isinstance(confirm, (int, float)) or not isinstance(poll, (int, float)):
        return None
    said = (
        f"Ray Train's hang detector (Ray {ray.__version__}, NCCL RAS; off unless "
        f"{getattr(constants, 'ENABLE_NCCL_HANG_DETECTOR_ENV_VAR', '?')}=1, NCCL only): a hang "
        f"confirmed after {confirm:.0f} s of no progress, polled every {poll:.0f} s, action "
        f"{action!r} by default: {confirm:.0f} s at least (by construction)"
    )
    return said, float(confirm)


def false_alarms_free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="runs of every job per load")
    parser.add_argument("--parallel", type=int, default=2, help="jobs at a time (default 2)")
    parser.add_argument("--load", default="0,2", help="CPU hogs per pass, comma-separated")
    parser.add_argument("--set", choices=("healthy", "faulty", "both"), default="both")
    parser.add_argument("--only", action="append", default=[], metavar="NAME")
    parser.add_argument("--watchdog", action="store_true", help="time torch's watchdog too")
    args = parser.parse_args()
    try:
        loads = [int(x) for x in args.load.split(",") if x.strip()]
    except ValueError:
        parser.error("--load takes numbers, e.g. 0,2")
    if args.runs < 1 or args.parallel < 1 or not loads or min(loads) < 0:
        parser.error("--runs and --parallel at least 1, --load at least one count >= 0")

    def chosen(jobs: list[false_alarms.Job]) -> list[false_alarms.Job]:
        return [j for j in jobs if not args.only or any(s in j.name for s in args.only)]

    healthy = chosen(false_alarms.healthy_jobs()) if args.set != "faulty" else []
    faulty = chosen(false_alarms.faulty_jobs()) if args.set != "healthy" else []
    if not healthy and not faulty:
        parser.error("no job matches --only " + " ".join(args.only))
    if not false_alarms.build_deepspeed_op([*healthy, *faulty]):
        return 1
    ok = True
    hang_medians: list[float] = []
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-alarm-rates-") as tmp:
        for load in loads:
            print(f"== load: {load} CPU hogs on {os.cpu_count()} cores ==", flush=True)
            with cpu_hogs(load):
                h = false_alarms.run_all(healthy, args.runs, args.parallel, Path(tmp) / f"h{load}")
                f = false_alarms.run_all(faulty, args.runs, args.parallel, Path(tmp) / f"f{load}")
            for line in [*per_job_hour(h), *latency_table(f)]:
                print(line)
            hangs = [o.detected_after_s for o in f if o.right and o.verdict == "hang"]
            hang_medians += (
                [statistics.median([t for t in hangs if t is not None])] if hangs else []
            )
            ok = ok and not any(o.false_alarm or o.timed_out for o in h)
            ok = ok and all(o.right for o in f)
        if args.watchdog:
            print("== without ddpdoctor: a hang under plain torchrun ==", flush=True)
            titan = watchdog_hang(Path(tmp), TITAN_TRAIN_TIMEOUT_S)
            ours = min(hang_medians) if hang_medians else None
            shown = f"{titan:.1f} s (measured)" if titan is not None else "not ended"
            print(f"torch's watchdog, TorchTitan's settings (train timeout 100 s): {shown}")
            for name, seconds in TORCH_DEFAULTS_S.items():
                print(f"torch's watchdog, {name} default: {seconds:.0f} s (by construction)")
            others: list[tuple[str, float | None]] = [("TorchTitan", titan)]
            others += TORCH_DEFAULTS_S.items()
            ray_train = ray_train_hang_detector()
            if ray_train is not None:
                print(ray_train[0])
                others.append(("Ray Train's hang detector", ray_train[1]))
            if ours:
                for name, seconds in others:
                    if seconds:
                        print(
                            f"  ddpdoctor's median hang {ours:.1f} s: {seconds / ours:.0f}x sooner than {name}"
                        )
    print(f"result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
