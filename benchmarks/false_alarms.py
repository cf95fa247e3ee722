"""False alarms on healthy jobs against detection on faulty ones, side by side.

Runs real jobs (`ddpdoctor run --no-tui --no-doctor --json`, torchrun or the job's own launcher,
gloo, the default adaptive hang threshold) and reads each one's final JSON document. The jobs are
corpus_jobs.py's: every corpus of tests/corpus (run, frameworks, FSDP, pipelines, Ray, DeepSpeed,
mismatch, replicas, recoveries, torchft), sample_jobs' broken scripts and the reference job with
injected faults, in a healthy and a faulty set.

    healthy set: a false alarm is a hang / mismatch / crash verdict, a finding of severity
                 warning or error (any `replicas.*` divergence included) that the job does not
                 expect, a stopped job or a non-zero exit. Jobs that recover (torchrun
                 --max-restarts, a torchft replica killed once) expect a warning: for them an
                 error finding, a problem verdict, a stop or a non-zero exit is a false alarm.
    faulty set:  detection latency is the monitor's `detected_after_s` (problem start ->
                 verdict); a detection is right when the verdict and the culprit ranks are the
                 expected ones.

    python benchmarks/false_alarms.py [--runs 1] [--parallel 2] [--set healthy|faulty] [--only NAME]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus_jobs import RUN_TIMEOUT_S, Job, faulty_jobs, healthy_jobs

__all__ = ["RUN_TIMEOUT_S", "Job", "Outcome", "faulty_jobs", "healthy_jobs", "run_all", "summary"]

ALARM_VERDICTS = {"hang", "mismatch", "crash"}
TEARDOWN_ABORT = "terminate called without an active exception"  # what torch's abort prints


@dataclass(frozen=True)
class Outcome:
    job: Job
    returncode: int | None  # None: killed after its timeout_s
    verdict: str | None
    culprits: tuple[int, ...]
    loud: tuple[str, ...]  # ids of findings of severity warning or error
    stopped_for: str | None
    detected_after_s: float | None
    wall_s: float
    # every rank recorded a clean exit, then torch's C++ teardown aborted one (docs/frameworks.md,
    # "At exit": under plain torchrun too): the job failed on its own, whatever ddpdoctor said
    aborted_at_exit: bool = False
    errors: tuple[str, ...] = ()  # ids of findings of severity error

    @property
    def timed_out(self) -> bool:
        """Killed by this benchmark after its timeout_s: no verdict at all, so neither an alarm
        nor a pass (a job that never started its ranks, one ddpdoctor slowed): told apart, and
        the run still fails."""
        return self.returncode is None

    @property
    def false_alarm(self) -> bool:
        if self.timed_out:
            return False
        if self.job.recovers:  # a recovered job is healthy, with its failure as a warning
            return bool(
                self.returncode != 0
                or self.verdict in ALARM_VERDICTS
                or self.errors
                or self.stopped_for is not None
            )
        if self.aborted_at_exit:
            # not ddpdoctor's word against a healthy job: the job exited non-zero. ddpdoctor
            # must say that and nothing else (a crash of the launcher), or it is an alarm.
            return not (self.verdict == "crash" and self.loud[:1] == ("run.launcher_failed",))
        return bool(
            self.returncode != 0
            or self.verdict in ALARM_VERDICTS
            or set(self.loud) - self.job.expected
            or self.stopped_for is not None
        )

    @property
    def right(self) -> bool:
        if self.verdict not in self.job.verdicts:
            return False
        if not self.job.expected <= set(self.loud):
            return False  # a fault whose finding is part of the answer (a chance pairing)
        if self.job.culprits_any:
            return bool(self.culprits) and set(self.culprits) <= set(self.job.culprits)
        return self.culprits == self.job.culprits


def _env(job: Job | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPDOCTOR_", "NCCL_"))}
    env.pop("RAY_ADDRESS", None)  # the Ray jobs start a local cluster of their own
    # ... whose raylet may take longer than Ray's 60 s to register on a loaded machine
    env.setdefault("RAY_raylet_start_wait_time_s", "600")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    # DeepSpeed's CPU op is built per virtualenv: two checkouts' jobs sharing torch's default
    # build folder rebuild it for each other's sources under one lock, and a rank waits on it
    # for minutes (a job that never started its ranks in 600 s, beside another checkout's tests).
    env.setdefault("TORCH_EXTENSIONS_DIR", str(_extensions_dir()))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(job.env if job else ())
    return env


def _extensions_dir() -> Path:
    venv = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "torch_extensions" / f"ddpdoctor-bench-{venv}"


def build_deepspeed_op(jobs: Sequence[Job], timeout_s: float = 1800.0) -> bool:
    """DeepSpeed on CPU compiles a shared-memory op into $TORCH_EXTENSIONS_DIR (default
    ~/.cache/torch_extensions) the first time a rank imports it: minutes on a loaded machine that
    would count as a job's time, and two jobs' ranks would wait on each other's build. Built here
    once, before the first DeepSpeed job, with the environment the jobs get; True when none is
    needed or it built."""
    needed = [job for job in jobs if ("DS_ACCELERATOR", "cpu") in job.env]
    if not needed:
        return True
    code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], env=_env(needed[0]), capture_output=True, text=True,
            timeout=timeout_s, start_new_session=True,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        print(f"DeepSpeed's CPU op: not built within {timeout_s:.0f} s", flush=True)
        return False
    if done.returncode != 0:
        print(f"DeepSpeed's CPU op: failed to build\n{done.stderr[-2000:]}", flush=True)
        return False
    print(f"DeepSpeed's CPU op: ready after {time.monotonic() - started:.0f} s", flush=True)
    return True


def _start(job: Job, work: Path) -> subprocess.Popen:
    work.mkdir(parents=True)
    cmd = [
        sys.executable, "-m", "ddpdoctor", "run", "--no-tui", "--no-doctor", *job.flags,
        "--json", "--run-dir", str(work / "run"), *job.args,
    ]  # fmt: skip
    with open(work / "stdout", "w") as out, open(work / "stderr", "w") as err:
        return subprocess.Popen(
            cmd, stdout=out, stderr=err, env=_env(job), cwd=work, start_new_session=True
        )


def _outcome(job: Job, proc: subprocess.Popen, work: Path, wall_s: float) -> Outcome:
    try:
        doc = json.loads((work / "stdout").read_text())
    except ValueError:
        doc = {}
    findings = doc.get("findings", [])
    return Outcome(
        job,
        proc.returncode,
        doc.get("verdict"),
        tuple(doc.get("culprits", [])),
        tuple(f["id"] for f in findings if f.get("severity") in ("warning", "error")),
        (doc.get("job") or {}).get("stopped_for"),
        doc.get("detected_after_s"),
        wall_s,
        proc.returncode not in (0, None) and _aborted_after_clean_exits(doc, work),
        tuple(f["id"] for f in findings if f.get("severity") == "error"),
    )


def _aborted_after_clean_exits(doc: dict, work: Path) -> bool:
    """Every rank ended with exit code 0 in ddpdoctor's record, and the job's output or logs show
    torch's teardown abort."""
    ranks = doc.get("ranks") or []
    if not ranks or any(rank.get("exit_code") != 0 for rank in ranks):
        return False
    texts = [work / "stderr", *sorted((work / "run" / "logs").rglob("*.log"))]
    return any(TEARDOWN_ABORT in path.read_text(errors="replace") for path in texts)


def run_all(jobs: Sequence[Job], runs: int, parallel: int, base: Path) -> list[Outcome]:
    pending = [(job, i) for i in range(runs) for job in jobs]
    running: list[tuple[Job, subprocess.Popen, Path, float]] = []
    done: list[Outcome] = []
    try:
        while pending or running:
            while pending and len(running) < parallel:
                job, i = pending.pop(0)
                work = base / f"{job.name}-{i}"
                running.append((job, _start(job, work), work, time.monotonic()))
            for entry in list(running):
                job, proc, work, started = entry
                elapsed = time.monotonic() - started
                if proc.poll() is None and elapsed < job.timeout_s:
                    continue
                if proc.poll() is None:
                    _kill(proc)
                    proc.returncode = None
                running.remove(entry)
                outcome = _outcome(job, proc, work, elapsed)
                done.append(outcome)
                _print_run(outcome)
            time.sleep(0.2)
    finally:
        for _, proc, _, _ in running:
            _kill(proc)
    return done


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except OSError:
        pass
    proc.wait()


def _print_run(o: Outcome) -> None:
    healthy_job = o.job.verdicts == {"healthy"}
    mark = (
        "TIMED OUT"
        if o.timed_out
        else ("FALSE ALARM" if o.false_alarm else "torch abort" if o.aborted_at_exit else "ok")
        if healthy_job
        else ("right" if o.right else "WRONG")
    )
    detected = f"{o.detected_after_s:.1f} s" if o.detected_after_s is not None else "-"
    print(
        f"  {o.job.name:<30} {mark:<11} verdict {o.verdict} culprits {list(o.culprits)} "
        f"detected {detected} stopped_for {o.stopped_for} loud {list(o.loud)} "
        f"exit {o.returncode} ({o.wall_s:.0f} s)",
        flush=True,
    )


def _spread(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return (
        f"median {statistics.median(values):.1f} s (min {min(values):.1f}, max {max(values):.1f})"
    )


def summary(healthy: Sequence[Outcome], faulty: Sequence[Outcome]) -> list[str]:
    alarms = [o for o in healthy if o.false_alarm]
    right = [o for o in faulty if o.right]
    latencies = [o.detected_after_s for o in faulty if o.right and o.detected_after_s is not None]
    hangs = [
        o.detected_after_s for o in right if o.verdict == "hang" and o.detected_after_s is not None
    ]
    left = [
        f"{len({o.job.name for o in healthy})} jobs, {len(healthy)} runs",
        f"false alarms: {len(alarms)}/{len(healthy)}",
        "alarmed: " + (", ".join(sorted({o.job.name for o in alarms})) or "none"),
        f"aborted by torch at exit, said so: {sum(o.aborted_at_exit for o in healthy)}",
        "timed out (no verdict): "
        + (", ".join(sorted({o.job.name for o in healthy if o.timed_out})) or "none"),
    ]
    right_col = [
        f"{len({o.job.name for o in faulty})} jobs, {len(faulty)} runs",
        f"verdict + culprit right: {len(right)}/{len(faulty)}",
        f"detected after: {_spread(latencies)}",
        f"  hangs only: {_spread(hangs)}",
    ]
    wrong = sorted({o.job.name for o in faulty if not o.right})
    if wrong:
        right_col.append("wrong: " + ", ".join(wrong))
    width = max(len(s) for s in ["healthy set (false alarms)", *left]) + 4
    lines = [f"{'healthy set (false alarms)':<{width}}faulty set (detection)"]
    for i in range(max(len(left), len(right_col))):
        a = left[i] if i < len(left) else ""
        b = right_col[i] if i < len(right_col) else ""
        lines.append(f"{a:<{width}}{b}".rstrip())
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="runs of every job (default 1)")
    parser.add_argument("--parallel", type=int, default=2, help="jobs at a time (default 2)")
    parser.add_argument("--set", choices=("healthy", "faulty", "both"), default="both")
    parser.add_argument(
        "--only", action="append", default=[], metavar="NAME",
        help="run only the jobs whose name contains NAME (repeatable)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.runs < 1 or args.parallel < 1:
        parser.error("--runs and --parallel must be at least 1")

    def chosen(jobs: list[Job]) -> list[Job]:
        return [j for j in jobs if not args.only or any(s in j.name for s in args.only)]

    healthy = chosen(healthy_jobs()) if args.set in ("healthy", "both") else []
    faulty = chosen(faulty_jobs()) if args.set in ("faulty", "both") else []
    if not healthy and not faulty:
        parser.error("no job matches --only " + " ".join(args.only))
    if not build_deepspeed_op([*healthy, *faulty]):
        return 1
    with tempfile.TemporaryDirectory(prefix="ddpdoctor-false-alarms-") as tmp:
        print(f"healthy set: {len(healthy)} jobs, faulty set: {len(faulty)} jobs, x{args.runs}")
        h = run_all(healthy, args.runs, args.parallel, Path(tmp) / "healthy")
        f = run_all(faulty, args.runs, args.parallel, Path(tmp) / "faulty")
    print()
    for line in summary(h, f):
        print(line)
    ok = not [o for o in h if o.false_alarm or o.timed_out] and all(o.right for o in f)
    print(f"result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
