"""Job runs shared across integration modules.

Every `ddpdoctor run` costs ~11 CPU-seconds, most of them importing torch in torchrun and the ranks,
so the suite's time is the number of jobs it starts. Jobs that several modules only need finished
(a verdict, a diagnosis.json, a run directory to read or watch) run once here, in one session
fixture, a few at a time (each spends much of its time importing or waiting), before the first test
that asks for them; no other test runs meanwhile, so timing-sensitive tests never share the CPU with
them. Tests read the results; a test that writes into a run directory copies it first.

Jobs whose timing is what a test is about (busy vs blocked, straggler thresholds, stop latency) are
not here: they run alone in their own modules.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.procs import PYTHON, REPO, clean_env, ddpdoctor_cmd, free_port, run_in_parallel

PARALLEL = 4
RUN_TIMEOUT_S = 150
SHARED_RUNS_TIMEOUT_S = 900  # every shared job, PARALLEL at a time, each within RUN_TIMEOUT_S
SAMPLES = REPO / "sample_jobs"
LAUNCH_JOBS = REPO / "tests" / "launch_jobs"
REFERENCE = ("--backend", "gloo", "--steps", "8")

WORLD_OF_THREE = textwrap.dedent(
    """
    import torch.distributed as dist
    dist.init_process_group("gloo", world_size=3)  # 2 ranks launched: waits for a third forever
    print("never here", flush=True)
    """
)


@dataclass(frozen=True)
class Job:
    """One shared run. `args` follow `ddpdoctor run --no-tui --no-doctor --nproc 2 --run-dir D`;
    `command`, when given, is run instead, with {run_dir} and {port} (a free port) filled in.
    `stdout`: "file" (read back into the result), "closed-pipe" (a pipe whose reader is gone) or
    "full" (/dev/full: every write fails with ENOSPC)."""

    name: str
    args: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    stdout: str = "file"


CRASH = (
    "--backend", "gloo", "--steps", "16",
    "--inject", "slow:rank=1,step=2,seconds=0.2",
    "--inject", "crash:rank=1,step=12",
)  # fmt: skip
# only node 0 of 2 is started: torchrun's rendezvous gives up after --join-timeout
NODE_NEVER_JOINS = tuple(ddpdoctor_cmd(
    "run", "--no-tui", "--no-doctor", "--nnodes", "2", "--node-rank", "0",
    "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:{port}",
    "--join-timeout", "6", "--run-dir", "{run_dir}", "--nproc", "1", "--json",
))  # fmt: skip
# an mp.spawn script (tcp:// init) whose rank 1 hangs, found with the default threshold
MP_SPAWN_TCP_HANG = tuple(ddpdoctor_cmd(
    "run", "--no-doctor", "--no-tui", "--json", "--run-dir", "{run_dir}",
    "--", PYTHON, str(LAUNCH_JOBS / "spawn_tcp_hang.py"), "{port}", "--hang-rank", "1",
))  # fmt: skip


# a user's own torchrun under `ddpdoctor run -- ...` (test_run_commands)
def users_torchrun(*options: str) -> tuple[str, ...]:
    return (
        *ddpdoctor_cmd("run", "--no-doctor", "--no-tui", "--json", "--run-dir", "{run_dir}"),
        *options,
        "--", PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(LAUNCH_JOBS / "env_hang.py"),
    )  # fmt: skip


SIGTERM_COLLECTIVE_HANG = (
    *ddpdoctor_cmd(
        "run", "--no-doctor", "--no-tui", "--json", "--run-dir", "{run_dir}", "--hang-after", "2"
    ),
    "--", PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
    str(LAUNCH_JOBS / "sigterm_collective.py"), "--hang-rank", "1", "--hang-step", "3",
)  # fmt: skip

PLAIN_MISSING_SET_EPOCH = (
    PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
    f"{SAMPLES}/missing_set_epoch.py",
)  # fmt: skip

FORGED_TABLE = (
    *ddpdoctor_cmd("run", "--no-doctor", "--no-tui", "--json", "--run-dir", "{run_dir}"),
    "--", PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
    str(LAUNCH_JOBS / "forged_table.py"), "--seconds", "22",
)  # fmt: skip

# The longest waits first, so that they overlap with the others.
JOBS = [
    # init_process_group(world_size=3) under 2 ranks: the verdict needs 10 s of waiting
    Job("world-size-3", ("--", "{base}/three.py")),
    Job("hang", (*REFERENCE, "--inject", "hang:rank=1,step=4")),  # default threshold
    Job("node-never-joins", command=NODE_NEVER_JOINS),  # test_run_multinode
    Job("mp-spawn-tcp-hang", command=MP_SPAWN_TCP_HANG),  # test_run_commands
    # the threshold is not what the hang's test is about: a small one ends it sooner
    Job(
        "users-torchrun-hang",
        command=(*users_torchrun("--hang-after", "2"), "--hang-rank", "0", "--hang-step", "3"),
    ),
    Job("users-torchrun", command=(*users_torchrun(), "--steps", "10")),
    # rank 0 prints a torchrun failure table naming rank 1 killed (test_run_trust): the job is
    # healthy for longer than a crash's stop takes (15 s), so a stop on that text would show
    Job("forged-table", command=FORGED_TABLE),
    # a hang whose ranks run one more collective in their SIGTERM handler as they are stopped
    # (as Lightning's do): the stop keeps the hang (test_run_commands)
    Job("sigterm-collective-hang", command=SIGTERM_COLLECTIVE_HANG),
    # the healthy reference job with ddpdoctor's stdout closed or full (test_run_hardening): the
    # closed pipe with the preflight doctor too, whose report is the first thing written
    Job(
        "closed-stdout",
        command=tuple(
            ddpdoctor_cmd(
                "run", "--no-tui", "--nproc", "2", "--steps", "10", "--run-dir", "{run_dir}"
            )
        ),
        stdout="closed-pipe",
    ),
    Job("full-stdout", ("--steps", "10"), stdout="full"),
    # slow from step 2 and a crash at step 12 on the same rank: a straggler finding, then the
    # crash. Ten slow steps: by default the all-reduce wait per step comes from DDP's own C++
    # timers, which report a step or two late, and the straggler rule judges medians of steps.
    Job("crash", CRASH),
    Job("exit", (*REFERENCE, "--inject", "exit:rank=1,step=4")),
    Job("mismatch", (*REFERENCE, "--inject", "mismatch:rank=1,step=4", "--hang-after", "3")),
    # --json: the final diagnosis alone on stdout (test_run_reference checks that too)
    Job("shape", ("--json", *REFERENCE, "--inject", "shape:rank=1,step=4", "--hang-after", "3")),
    # the healthy reference job, read by test_run_reference and watched by test_run_hardening
    Job("reference-healthy", ("--steps", "12")),
    *[
        Job(
            f"sample-{name}",
            ("--backend", "gloo", "--hang-after", "3", "--", f"{SAMPLES}/{name}.py"),
        )
        for name in (
            "stuck_dataloader",
            "healthy",
            "missing_set_epoch",
            "slow_rank",
            "exception_on_one_rank",
            "rank0_only_barrier",
            "uneven_data",
            "allreduce_size_mismatch",
        )
    ],
    # the same sample under plain torchrun: it must print what it prints under ddpdoctor
    Job("plain-missing_set_epoch", command=PLAIN_MISSING_SET_EPOCH),
]


@dataclass(frozen=True)
class Result:
    name: str
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path
    diagnosis: dict

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def explain(self) -> str:
        return f"{self.name}: rc={self.returncode}\n{self.stdout[-3000:]}\n{self.stderr[-3000:]}"

    def ids(self) -> list[str]:
        return [f["id"] for f in self.diagnosis["findings"]]

    def finding(self, finding_id: str) -> dict:
        return next(f for f in self.diagnosis["findings"] if f["id"] == finding_id)


class SharedRuns:
    def __init__(self, results: dict[str, Result]):
        self._results = results

    def __getitem__(self, name: str) -> Result:
        return self._results[name]

    def get(self, name: str) -> Result:
        """The run of `name`, which must have left its diagnosis.json."""
        result = self._results[name]
        assert result.diagnosis, f"{name}: no diagnosis.json\n{result.explain()}"
        return result


def _command(job: Job, base: Path, run_dir: Path) -> list[str]:
    if job.command:
        port = str(free_port())
        return [a.replace("{run_dir}", str(run_dir)).replace("{port}", port) for a in job.command]
    args = [a.replace("{base}", str(base)) for a in job.args]
    return ddpdoctor_cmd(
        "run", "--no-tui", "--no-doctor", "--nproc", "2", "--run-dir", str(run_dir), *args
    )


def _start(job: Job, base: Path, env: dict[str, str]) -> subprocess.Popen:
    work = base / job.name
    work.mkdir()
    run_dir = work / "run"
    (work / "stdout").touch()
    if job.stdout == "closed-pipe":
        read_end, out = os.pipe()
        os.close(read_end)
    else:
        out = os.open(work / "stdout" if job.stdout == "file" else "/dev/full", os.O_WRONLY)
    try:
        with open(work / "stderr", "w") as err:
            proc = subprocess.Popen(  # the child keeps its own copies of both
                _command(job, base, run_dir),
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=work,
                start_new_session=True,
            )  # fmt: skip
    finally:
        os.close(out)
    return proc


def _finish(name: str, proc: subprocess.Popen, timed_out: bool, work: Path) -> Result:
    run_dir = work / "run"
    stderr = (work / "stderr").read_text(errors="replace")
    if timed_out:
        stderr += f"\n(test: killed after {RUN_TIMEOUT_S} s)"
    path = run_dir / "diagnosis.json"
    diagnosis = json.loads(path.read_text()) if path.exists() else {}
    stdout = (work / "stdout").read_text(errors="replace")
    return Result(name, proc.returncode, stdout, stderr, run_dir, diagnosis)


def run_jobs(jobs: Sequence[Job], base: Path) -> dict[str, Result]:
    """Run `jobs`, PARALLEL at a time, each bounded by RUN_TIMEOUT_S; kill what is left on error."""
    (base / "three.py").write_text(WORLD_OF_THREE)
    env = clean_env({"DDPDOCTOR_CACHE_DIR": str(base / "data-cache")})
    starts = {job.name: functools.partial(_start, job, base, env) for job in jobs}
    ended = run_in_parallel(starts, parallel=PARALLEL, timeout_s=RUN_TIMEOUT_S)
    return {
        name: _finish(name, proc, timed_out, base / name)
        for name, (proc, timed_out) in ended.items()
    }


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory) -> SharedRuns:
    return SharedRuns(run_jobs(JOBS, tmp_path_factory.mktemp("shared-runs")))


# -- running the suite on two workers (make test: pytest -n 2 --dist loadgroup) ------------------
# Each integration module runs whole on one worker (its module fixtures start its jobs once),
# except where modules share something that two workers must not use at once: the shared runs
# above (one session fixture), Slurm's one node (srun steps would queue behind each other) and
# the lab's hosts (one module's firewall rules would cut another's traffic).
def _worker_group(items: list[pytest.Item]) -> str:
    if any(item.get_closest_marker("lab") for item in items):
        return "lab"
    if any(
        "shared_runs" in item.fixturenames or item.get_closest_marker("slurm") for item in items
    ):
        return "shared-runs-and-slurm"
    return items[0].nodeid.split("::")[0]


def pytest_collection_modifyitems(config, items):
    modules: dict[str, list[pytest.Item]] = {}
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.path)).parent == here:
            modules.setdefault(str(item.path), []).append(item)
    # The first test that asks for the shared runs waits for all of them: on a busy worker that
    # takes longer than one test's usual limit.
    shared_setup = pytest.mark.timeout(SHARED_RUNS_TIMEOUT_S)
    for members in modules.values():
        group = pytest.mark.xdist_group(_worker_group(members))
        for item in members:
            item.add_marker(group)
            if "shared_runs" in item.fixturenames:
                item.add_marker(shared_setup)
