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
# Each shared run ends on its own (healthy) or is stopped by ddpdoctor (faults) in 20-60 s on a
# quiet machine; the bound is for a run that never ends. Four at once beside the other worker's
# jobs on two cores, the reference job with its preflight doctor took over 150 s.
RUN_TIMEOUT_S = 240
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
    slow: bool = False  # only the slow tier's tests read it: started only when they run


CRASH = (
    "--backend", "gloo", "--steps", "16",
    "--inject", "slow:rank=1,step=2,seconds=0.5",
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
    Job("world-size-3", ("--", "{base}/three.py"), slow=True),
    Job("hang", (*REFERENCE, "--inject", "hang:rank=1,step=4")),  # default threshold
    Job("node-never-joins", command=NODE_NEVER_JOINS),  # test_run_multinode
    Job("mp-spawn-tcp-hang", command=MP_SPAWN_TCP_HANG),  # test_run_commands
    # the threshold is not what the hang's test is about: a small one ends it sooner
    Job(
        "users-torchrun-hang",
        command=(*users_torchrun("--hang-after", "2"), "--hang-rank", "0", "--hang-step", "3"),
        slow=True,
    ),
    Job("users-torchrun", command=(*users_torchrun(), "--steps", "10")),
    # rank 0 prints a torchrun failure table naming rank 1 killed (test_run_trust): the job is
    # healthy for longer than a crash's stop takes (15 s), so a stop on that text would show
    Job("forged-table", command=FORGED_TABLE, slow=True),
    # a hang whose ranks run one more collective in their SIGTERM handler as they are stopped
    # (as Lightning's do): the stop keeps the hang (test_run_commands)
    Job("sigterm-collective-hang", command=SIGTERM_COLLECTIVE_HANG, slow=True),
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
        slow=True,
    ),
    Job("full-stdout", ("--steps", "10"), stdout="full", slow=True),
    # slow from step 2 and a crash at step 12 on the same rank: a straggler finding, then the
    # crash. Ten slow steps: by default the all-reduce wait per step comes from DDP's own C++
    # timers, which report a step or two late, and the straggler rule judges medians of steps.
    Job("crash", CRASH),
    Job("exit", (*REFERENCE, "--inject", "exit:rank=1,step=4"), slow=True),
    Job("mismatch", (*REFERENCE, "--inject", "mismatch:rank=1,step=4", "--hang-after", "3")),
    # --json: the final diagnosis alone on stdout (test_run_reference checks that too)
    Job("shape", ("--json", *REFERENCE, "--inject", "shape:rank=1,step=4", "--hang-after", "3")),
    # the healthy reference job, read by test_run_reference and watched by test_run_hardening
    Job("reference-healthy", ("--steps", "12")),
    *[
        Job(
            f"sample-{name}",
            ("--backend", "gloo", "--hang-after", "3", "--", f"{SAMPLES}/{name}.py"),
            slow=slow,
        )
        for name, slow in (
            ("stuck_dataloader", True),
            ("healthy", False),
            ("missing_set_epoch", True),
            ("slow_rank", True),
            ("exception_on_one_rank", True),
            ("rank0_only_barrier", True),
            ("uneven_data", True),
            ("allreduce_size_mismatch", True),
        )
    ],
    # the same sample under plain torchrun: it must print what it prints under ddpdoctor
    Job("plain-missing_set_epoch", command=PLAIN_MISSING_SET_EPOCH, slow=True),
]
# every shared job, PARALLEL at a time, each within RUN_TIMEOUT_S (the slow tier's with the
# first's: 676 s beside the slow corpora, where the old fixed 900 s left a quarter to spare)
SHARED_RUNS_TIMEOUT_S = -(-len(JOBS) // PARALLEL) * RUN_TIMEOUT_S


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
        if name not in self._results and any(j.name == name and j.slow for j in JOBS):
            raise KeyError(f"the shared run {name!r} is started only with the slow tier's tests")
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
def shared_runs(request, tmp_path_factory) -> SharedRuns:
    # The slow tier's jobs only when one of its tests that read the shared runs was selected.
    slow_wanted = any(
        item.get_closest_marker("slow") and "shared_runs" in item.fixturenames
        for item in request.session.items
    )
    jobs = [job for job in JOBS if slow_wanted or not job.slow]
    return SharedRuns(run_jobs(jobs, tmp_path_factory.mktemp("shared-runs")))


# -- running the suite on two workers (make test: pytest -n 2 --dist loadgroup) ------------------
# A module's tests run on one worker (its module fixtures start its jobs once), except where
# tests share something two workers must not use at once: the shared runs above (one session
# fixture: every test that reads them, in one group), Slurm's one node (srun steps would queue
# behind each other: one group) and the lab's hosts (one module's firewall rules would cut
# another's traffic: the lab's modules whole, in one group). The shared runs' readers and the
# srun tests leave the rest of their modules free for the other worker: kept together, they made
# one worker's share twice the other's.
def _worker_group(item: pytest.Item, module: list[pytest.Item]) -> str:
    # The Ray modules join the lab's: two Ray clusters starting at once on two cores miss Ray's
    # own 60 s start-up limits.
    if any(each.get_closest_marker("lab") or each.get_closest_marker("ray") for each in module):
        return "lab"
    if "shared_runs" in item.fixturenames:
        return "shared-runs"
    if item.get_closest_marker("slurm"):
        return "slurm"
    return item.nodeid.split("::")[0]


# -- the two tiers: `make test` (CI) and `make test-slow` ------------------------------------
# On two cores every job costs ~12 CPU-seconds of importing torch in its launcher and ranks, and
# `make test` has 8 minutes. It keeps the unit and TUI tests and, of the integration tests, one
# real job for each verdict, launcher and command (the shared runs above, mp.spawn, srun, the
# doctor, explain, watch, the TUI live, the lab's preflight faults). The tests of
# users' code in quantity (the corpora, the frameworks, FSDP), the other multi-host lab
# scenarios, and the tests that start jobs of their own to time or kill them are marked `slow`
# here and run by `make test-slow` (`make test-all`: every tier, Ray's included).
SLOW_MODULES = {
    "test_frameworks.py": "Lightning, accelerate and the HF Trainer, healthy and faulty",
    "test_fsdp_runs.py": "the FSDP2 / DeviceMesh corpus, healthy and faulty",
    "test_pipeline_runs.py": "the pipeline corpus: pipelining schedules and send/recv, healthy and faulty",
    "test_deepspeed_runs.py": "DeepSpeed ZeRO-2/3 under its launcher and torchrun, healthy and faulty",
    "test_mismatch_culprits.py": "mismatch culprits on independently written jobs, quiet and loaded",
    "test_corpus_runs.py": "the run corpus: pytorch/examples and tutorial recipes",
    "test_run_gate_and_output.py": "guarded collectives in Lightning jobs",
    "test_busy_ranks.py": "busy vs blocked ranks: timing, alone",
    "test_lab_network.py": "cut links and stalled peers on the lab's hosts",
    "test_lab_node_loss.py": "lost hosts and killed launchers on the lab's hosts",
    "test_lab_host_lost.py": "lost hosts during start-up and training, users' scripts, in the lab",
    "test_lab_run.py": "every launcher across the lab's hosts",
    "test_lab_slurm.py": "srun across the lab's hosts (make test keeps srun on one host)",
    "test_run_multinode.py": "two torchrun nodes on one machine",
    "test_run_signals.py": "hang-ups and Ctrl-C under srun",
    "test_full_disk.py": "a full run directory under a running job",
    "test_run_recovery.py": "torchrun restarts: attempts that fail, recover or spend the budget",
    "test_run_forged_ranks.py": "forged ranks beside a healthy job",
    "test_run_node_stops.py": "Ctrl-C on one of two torchrun nodes on one machine",
    "test_script_citation.py": "the preflight's line cited in the final diagnosis",
}
SLOW_TESTS = (  # single tests that start (and time or kill) jobs of their own
    "test_run_commands.py::test_srun_crash_names_the_rank_that_raised",
    "test_run_commands.py::test_srun_hang_names_the_rank_and_stops_the_step",
    "test_run_commands.py::test_nothing_of_an_mp_spawn_job_outlives_a_killed_ddpdoctor",
    "test_run_commands.py::test_a_script_run_by_the_bootstrap_without_rank_variables",
    "test_run_hardening.py::test_sigkill_to_ddpdoctor_ends_every_process",
    "test_run_hardening.py::test_ctrl_c_on_a_healthy_run_is_interrupted_not_a_crash",
    "test_run_hardening.py::test_a_daemon_a_rank_started_ends_with_the_run",
    # ddpdoctor's own stdout closed or full, and a hang whose SIGTERM handlers run a collective:
    # the quick tier keeps one healthy run and one stopped hang (their shared runs are slow=True)
    "test_run_hardening.py::test_a_closed_stdout_never_stops_the_job",
    "test_run_trust.py::test_",  # a torchrun failure table printed by a healthy job (22 s)
    # a hang under the user's own torchrun (the quick tier keeps its healthy run and the hangs
    # under ddpdoctor's torchrun and mp.spawn)
    "test_run_commands.py::test_a_hang_under_a_users_torchrun_names_the_rank",
    # explain of a crash run for it (the quick tier explains recorded run directories)
    "test_explain_cli.py::test_a_live_crash_is_explained_from_its_run_directory",
    # forged exit, pid and world during training (the claims' rules are the unit tests')
    "test_run_claims.py::test_forged_exit_pid_and_world_neither_stop_nor_fail_a_one_node_job",
    "test_run_hardening.py::test_a_full_disk_on_stdout_never_stops_the_job",
    "test_run_commands.py::test_a_stopped_hang_stays_a_hang_whatever_the_sigterm_handlers_do",
    "test_run_endings.py::test_sigterm_to_an_mp_spawn_parent_is_an_interrupted_run_not_a_healthy_one",
    "test_run_inputs.py::test_keep_running_leaves_a_hung_job_until_ctrl_c",
    # both hosts' firewalls and MTUs changed, each scenario alone after the others
    "test_lab_faults.py::test_every_rank_ends_and_the_report_comes_within_the_timeout[data-ports",
    "test_lab_faults.py::test_every_rank_ends_and_the_report_comes_within_the_timeout[jumbo-mtu]",
    "test_lab_faults.py::test_a_firewall_that_lets_only_master_port_through_is_named",
    "test_lab_faults.py::test_an_mtu_black_hole_is_named_with_the_mtus",
    # a reload on rank 0 in a helper: the quick tier's replica check is the unit rules' and the
    # digests' own (tests/unit); the real jobs are the slow tier's
    "test_replicas.py::test_a_reload_on_rank_0_in_a_helper_is_named_with_its_step_and_line",
    # forged claims during a 40 s stall of every rank, one node and two
    "test_run_claims.py::test_a_forged_network_look_on_one_node_is_not_read",
    "test_run_claims.py::test_forged_gone_and_network_look_stop_neither_node",
    "test_run_claims.py::test_forged_calls_errors_and_steps_neither_stop_nor_fail",
    "test_run_claims.py::test_forged_calls_errors_and_another_nodes_look_stop_neither_node",
    # a node's summary rewritten with a row naming another call, once and again and again
    "test_run_claims.py::test_a_rewritten_node_summary_stops_neither_node",
    # the pods' doctors behind a DNS server that never answers (the late name is the quick one)
    "test_pod_doctor.py::test_a_dns_server_that_never_answers_costs_the_timeout_not_more",
    # the sample scripts beyond a healthy one and a hang (their shared runs are slow=True)
    # the quick tier keeps one crash and one mismatch of the reference job: an os._exit and a
    # world no launch can fill (a 10 s wait) are the slow tier's (their shared runs are slow=True)
    "test_run_reference.py::test_crash_and_exit_are_reported_with_their_codes[exit-17]",
    "test_run_reference.py::test_exit_trail_is_a_fault_and_no_exit_event",
    "test_diagnose_jobs.py::test_faults_get_their_verdict_and_rank_1_as_culprit[exit-",
    # explain of flight-recorder dumps that two plain torchrun jobs leave (34 s): the quick tier
    # explains the dumps recorded in tests/fixtures/flight_recorder
    "test_postmortem.py::test_a_real_hang_dump_names_the_rank_behind_and_the_wait",
    "test_postmortem.py::test_a_real_dump_and_its_logs_tell_one_story",
    "test_run_hardening.py::test_a_world_size_no_launch_can_fill_is_diagnosed_and_stopped",
    "test_diagnose_jobs.py::test_healthy_jobs_get_no_alarm[sample-missing_set_epoch]",
    "test_diagnose_jobs.py::test_missing_set_epoch_is_reported_before_it_bites",
    "test_diagnose_jobs.py::test_slow_rank_is_a_straggler_not_a_hang",
    "test_diagnose_jobs.py::test_faults_get_their_verdict_and_rank_1_as_culprit[sample-exception",
    "test_diagnose_jobs.py::test_rank0_only_barrier_is_a_mismatch_with_rank_0_as_culprit",
    "test_diagnose_jobs.py::test_faults_get_their_verdict_and_rank_1_as_culprit[sample-stuck",
    "test_diagnose_jobs.py::test_hang_diagnosis_cites_the_flight_recorders_sequence_numbers[sample-stuck",
    "test_diagnose_jobs.py::test_uneven_data_is_called_uneven_inputs",
    "test_diagnose_jobs.py::test_allreduce_size_mismatch_names_both_sides",
    "test_sample_jobs.py::test_a_sample_behaves_the_same_with_and_without_ddpdoctor",
    "test_sample_jobs.py::test_missing_set_epoch_is_caught_by_the_sampler_audit",
)


def _is_slow(item: pytest.Item) -> bool:
    path = Path(str(item.path)).name
    test = f"{path}::{item.name}"
    return path in SLOW_MODULES or any(test.startswith(prefix) for prefix in SLOW_TESTS)


# First, before xdist's own hook reads the xdist_group marks into the test ids (without
# tryfirst, a run given tests/integration as its path registers this conftest before xdist's
# worker plugin, the marks come too late, and every worker runs every module's jobs at once).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    modules: dict[str, list[pytest.Item]] = {}
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.path)).parent == here:
            modules.setdefault(str(item.path), []).append(item)
            if _is_slow(item):
                item.add_marker(pytest.mark.slow)
    # The first test that asks for the shared runs waits for all of them: on a busy worker that
    # takes longer than one test's usual limit.
    shared_setup = pytest.mark.timeout(SHARED_RUNS_TIMEOUT_S)
    for members in modules.values():
        for item in members:
            item.add_marker(pytest.mark.xdist_group(_worker_group(item, members)))
            if "shared_runs" in item.fixturenames:
                item.add_marker(shared_setup)
