"""Helpers for tests that start real processes: free ports, bounded runs, whole-group cleanup.

Every process a test starts gets its own session (process group), a timeout, and is killed with
its whole group on teardown, so a test of a hang can never hang the suite or leak ranks.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import psutil

from ddpdoctor.protocol.rundir import ENV_RUN_DIR

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def load_script(relative: str) -> ModuleType:
    """A script of the repository that is not a package's module (benchmarks/, scripts/),
    imported by its path under its own name (registered first: dataclasses look their module
    up in sys.modules)."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A TCP port nobody listens on right now (bind to port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test process's environment minus launcher variables a developer's shell may carry."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "TORCHELASTIC_RUN_ID",
        }
        and not k.startswith(("SLURM_", "OMPI_", "PMI_", "NCCL_", "DDPDOCTOR_"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("NO_COLOR", None)
    if extra:
        env.update(extra)
    return env


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float


@dataclass(frozen=True)
class JsonRun:
    """A finished `ddpdoctor run --json`: its exit code, its output and its run directory."""

    returncode: int | None
    stdout: str
    stderr: str
    run_dir: Path

    def document(self) -> dict:
        """The final document `--json` printed on stdout."""
        assert self.stdout.strip(), f"no JSON on stdout\n{self.stderr[-3000:]}"
        return json.loads(self.stdout)

    def events(self, rank: int, kind: str | None = None) -> list[dict]:
        """A rank's events as written (those of one kind, with `kind`)."""
        from ddpdoctor.protocol.events import parse_event_line

        path = self.run_dir / "events" / f"rank-{rank}.jsonl"
        found = (parse_event_line(line) for line in path.read_text().splitlines())
        return [e for e in found if e and (kind is None or e["kind"] == kind)]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after a moment."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def run(
    cmd: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: str | None = None,
) -> Finished:
    """Run to completion within `timeout` seconds; on timeout the group is killed and the test fails."""
    start = time.monotonic()
    proc = subprocess.Popen(
        list(cmd),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env) if env is not None else clean_env(),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        raise AssertionError(
            f"timed out after {timeout} s: {' '.join(map(str, cmd))}\n"
            f"--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-4000:]}"
        ) from None
    finally:
        kill_group(proc)
    return Finished(proc.returncode, out, err, time.monotonic() - start)


@contextlib.contextmanager
def background(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
) -> Iterator[subprocess.Popen]:
    """A process that runs while the block runs; its whole group is killed when the block ends."""
    proc = subprocess.Popen(
        list(cmd),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        text=True,
        env=dict(env) if env is not None else clean_env(),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        kill_group(proc)


def run_in_parallel(
    starts: Mapping[str, Callable[[], subprocess.Popen]], *, parallel: int, timeout_s: float
) -> dict[str, tuple[subprocess.Popen, bool]]:
    """Start the jobs `parallel` at a time (each start function starts one in its own session),
    each bounded by `timeout_s`: name -> (its process, whether it was killed for the timeout),
    every process group killed once it ended, and what is left killed on error."""
    pending = list(starts.items())
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    done: dict[str, tuple[subprocess.Popen, bool]] = {}
    try:
        while pending or running:
            while pending and len(running) < parallel:
                name, start = pending.pop(0)
                running[name] = (start(), time.monotonic())
            for name, (proc, started) in list(running.items()):
                if proc.poll() is None and time.monotonic() - started < timeout_s:
                    continue
                timed_out = proc.poll() is None
                kill_group(proc)
                del running[name]
                done[name] = (proc, timed_out)
            time.sleep(0.2)
    finally:
        for proc, _ in running.values():
            kill_group(proc)
    return done


def ddpdoctor_cmd(*args: str) -> list[str]:
    return [PYTHON, "-m", "ddpdoctor", *args]


R = TypeVar("R", bound=JsonRun)


def run_json_jobs(
    commands: Mapping[str, Callable[[Path], Sequence[str]]],
    base: Path,
    *,
    parallel: int,
    timeout_s: float,
    env: Mapping[str, str] | Callable[[str], Mapping[str, str]] | None = None,
    result: type[R] = JsonRun,  # type: ignore[assignment]
) -> dict[str, R]:
    """Run named `ddpdoctor run --json` jobs, `parallel` at a time and each within `timeout_s`:
    each works in base/<name> (its cwd, its stdout and stderr files; the command is built from
    that folder, its run directory conventionally work/run). A job killed for the timeout has
    no exit code and says so at the end of its stderr. `env`: one for every job, or a job's
    from its name."""

    def start(name: str, command: Callable[[Path], Sequence[str]]) -> subprocess.Popen:
        work = base / name
        work.mkdir()
        job_env = env(name) if callable(env) else env
        with open(work / "stdout", "w") as out, open(work / "stderr", "w") as err:
            return subprocess.Popen(  # the child keeps its own copies of both
                list(command(work)), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                env=dict(job_env) if job_env is not None else clean_env(), cwd=work,
                start_new_session=True,
            )  # fmt: skip

    starts = {name: functools.partial(start, name, command) for name, command in commands.items()}
    ended = run_in_parallel(starts, parallel=parallel, timeout_s=timeout_s)
    done: dict[str, R] = {}
    for name, (proc, timed_out) in ended.items():
        work = base / name
        stderr = (work / "stderr").read_text(errors="replace")
        if timed_out:
            stderr += f"\n(test: killed after {timeout_s} s)"
        stdout = (work / "stdout").read_text(errors="replace")
        done[name] = result(None if timed_out else proc.returncode, stdout, stderr, work / "run")
    return done


def wait_for(predicate, *, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Poll until predicate() is truthy; return its value, or fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def job_processes(run_dir: Path) -> list[psutil.Process]:
    """Processes still carrying this run's DDPDOCTOR_RUN_DIR: torchrun, ranks, loader workers."""
    target = str(run_dir.resolve())
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(ENV_RUN_DIR) == target:
                found.append(proc)
        except psutil.Error:
            continue
    return found


# torch's C++ teardown of a process group now and then aborts a rank that has finished its
# script, with or without ddpdoctor (docs/frameworks.md, "At exit"): std::terminate's message.
TEARDOWN_ABORT = "terminate called without an active exception"
ABORT_EXITS = ("SIGABRT", "return code = -6")


def assert_healthy_unless_aborted_at_exit(
    doc: dict, returncode: int | None, aborted: bool, context: str
) -> None:
    """A healthy job's final diagnosis: healthy with no warning, exit 0; or, when torch's teardown
    aborted a rank that had finished (`aborted`: docs/frameworks.md, "At exit": with or without
    ddpdoctor, now and then on a loaded machine), the job failed and ddpdoctor says so, without
    blaming its training."""
    if aborted:
        assert returncode == 1 and doc["verdict"] == "crash", context
        errors = [f["id"] for f in doc["findings"] if f["severity"] == "error"]
        assert errors[:1] == ["run.launcher_failed"], context
        return
    assert returncode == 0, context
    assert doc["verdict"] == "healthy" and doc["culprits"] == [], context
    loud = [
        (f["id"], f["summary"])
        for f in doc["findings"]
        if f["severity"] != "info" and not cores_taken(f)
    ]
    assert loud == [], context


def cores_taken(finding: dict) -> bool:
    """A straggler whose whole excess is its wait for a CPU that the other ranks did not wait
    (rules/straggler.py): another process took its cores. The test machine runs two test
    workers' jobs at once on two cores, so that is the host's state, rightly reported; it says
    nothing against the job, which is what a healthy test judges."""
    return finding["id"] == "straggler" and "mostly waiting for a CPU" in finding["summary"]


def exited_cleanly_then_aborted(run_dir: Path, text: str, ranks: Sequence[int]) -> bool:
    """Whether every rank in `ranks` recorded a clean exit in `run_dir` and `text` (the job's
    output or logs) shows torch's teardown abort: a job that finished, then failed in teardown."""
    # torchrun says SIGABRT; DeepSpeed's launcher "exits with return code = -6"
    if TEARDOWN_ABORT not in text or not any(s in text for s in ABORT_EXITS):
        return False
    for rank in ranks:
        path = run_dir / "events" / f"rank-{rank}.jsonl"
        try:
            events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError):
            return False
        exits = [e for e in events if e.get("kind") == "exit"]
        if not exits or exits[-1].get("code") != 0:
            return False
    return True
