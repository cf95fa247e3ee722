"""`ddpdoctor run`, start to finish: run directory, run.json, preflight doctor, torchrun, watching.

    plan (launch_plan.py) -> RunDir + run.json -> doctor -> TorchrunProcess (job.py: torchrun + its workers)
        -> Monitor polled through SupervisedRun (supervise.py) by the TUI or the headless loop
        -> final snapshot, diagnosis.json, the closing summary, and the exit code

Exit codes: 0 the job ran and the verdict is healthy; 1 the doctor refused (a failed check of
the machine or the launch; never the script checkup), the job hung,
mismatched or crashed, or exited non-zero; 2 a usage error (raised before anything starts); 130 the
user interrupted it. The job never outlives this function (see TorchrunProcess).

A job that spans nodes runs one launcher per node (`--nnodes N --node-rank I`), all writing into one
run directory on a shared filesystem: node 0 writes run.json; each node keeps its own torchrun logs
(logs/<host>/node-<I>/), its doctor.json and its node record (nodes/node-<I>/), supervises its own
torchrun, answers the other launchers' stack requests, and watches every rank.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from ddpdoctor.console import make_console, tui_capable
from ddpdoctor.launch.capacity import HostCapacity, check_nproc
from ddpdoctor.launch.closing import (
    RunOutcome,
    closing_lines,
    exit_code_for,
    json_document,
)
from ddpdoctor.launch.command import spawn_hint, starts_own_ranks
from ddpdoctor.launch.hangup import Hangup
from ddpdoctor.launch.plan import LaunchPlan, installed_torch_version, run_json_document
from ddpdoctor.launch.preflight import preflight, refuse
from ddpdoctor.launch.ray_relay import RelayProcess
from ddpdoctor.launch.reaper import ENV_LAUNCH_ID, Reaper, end_marked, new_launch_id
from ddpdoctor.launch.supervise import StopPolicy, SupervisedRun
from ddpdoctor.launch.torchrun_cmd import ENV_DDP_BUCKETS, job_env, torchrun_argv
from ddpdoctor.launch.torchrun_process import STOP_GRACE_S, TorchrunProcess
from ddpdoctor.launch.user_command import command_env, guarded_argv
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.node_records import STOPPED_INTERRUPTED, NodeRecord, NodeRecorder
from ddpdoctor.protocol.rank_socket import ENV_RANK_SOCKET, RankSocket
from ddpdoctor.protocol.rundir import RunDir, write_json_atomic
from ddpdoctor.protocol.torchrun_logs import AgentLogParser
from ddpdoctor.protocol.verdicts import Verdict
from ddpdoctor.stacks.responder import StackResponder

if TYPE_CHECKING:  # pragma: no cover - read by attribute only; the command supplies the monitor
    pass

POLL_S = 0.5


@dataclass(frozen=True)
class Watchers:
    """What watches the job, supplied by the command: the launcher sits below the monitor and the
    TUI in the layers and never imports them.

    monitor(run_dir, hang_after=, node_rank=, follow_all_nodes=)
                                                a Monitor: .poll() .request_stacks() .close()
    headless(console, live=)                    the plain-text view: .update() .job_output() .close()
    tui(source, mode=, job=, title=)            runs the Textual app until the job ends or the user quits
    """

    monitor: Callable[..., Any]
    headless: Callable[..., Any]
    tui: Callable[..., Any] | None = None


@dataclass
class Interrupts:
    signum: int | None = None
    monitor: Any = None
    verdict_before: Verdict | None = None  # the verdict when the user stopped the run
    recorder: Any = None  # this node's record, in a job over several nodes

    def note(self, signum: int) -> None:
        if self.signum is None:
            last = getattr(self.monitor, "last", None)
            self.verdict_before = last.verdict if last is not None else None
            if self.recorder is not None:  # the other nodes stop their part with this one's
                self.recorder.stopped(STOPPED_INTERRUPTED)
        self.signum = signum


def launch(plan: LaunchPlan, watchers: Watchers) -> int:
    # From the preflight to the last line printed, a hangup of the terminal leaves the job
    # running (or starting) and ddpdoctor watching it to the end (hangup.py).
    with Hangup().installed() as hangup:
        return _launch(plan, watchers, hangup)


def _launch(plan: LaunchPlan, watchers: Watchers, hangup: Hangup) -> int:
    if plan.command is None:  # a user's command decides its own ranks
        check_nproc(plan.nproc_per_node, HostCapacity.here(), plan.workers or 0)
    if plan.run_dir is not None:
        RunDir.check_fresh(plan.run_dir, node_rank=plan.node_rank)
    run_dir = RunDir.create(plan.run_dir)
    console = make_console(sys.stderr if plan.json else sys.stdout)
    torch_version = installed_torch_version()
    log_dir = run_dir.node_logs_dir(plan.node_rank)
    if plan.command is not None:  # the user's own launch command, run as given (guarded)
        argv = guarded_argv(plan.command.argv)
    else:
        argv = torchrun_argv(
            nproc_per_node=plan.nproc_per_node,
            rendezvous=plan.rendezvous,
            log_dir=log_dir,
            program=plan.program,
        )
    # On several nodes sharing the run directory, node 0 describes the run: it always writes,
    # the others only fill the place until it does (never over node 0's, whichever starts first).
    document = run_json_document(
        plan, run_dir=run_dir.path, torchrun=argv, torch_version=torch_version
    )
    write_json_atomic(run_dir.run_json, document, replace=plan.node_rank in (None, 0))
    recorder = node_recorder(plan, run_dir, log_dir)
    if plan.command is None and plan.script and starts_own_ranks(plan.script):
        console.print(f"ddpdoctor: warning: {spawn_hint(plan.script)}", markup=False)
    refused = preflight(plan, run_dir, console) if plan.doctor else None
    if refused is not None:
        return refuse(plan, watchers, run_dir, console, recorder, refused)
    if plan.command is not None:
        env = command_env(
            os.environ,
            run_dir=run_dir,
            backend=plan.backend,
            torch_version=torch_version,
            slurm_env=plan.slurm_env,
        )
    else:
        env = job_env(
            os.environ, run_dir=run_dir, backend=plan.backend, torch_version=torch_version
        )
    if plan.ddp_buckets:  # --ddp-buckets: a Python comm hook records every gradient bucket
        env[ENV_DDP_BUCKETS] = "1"
    # Every process of the job carries this marker: whatever still has it when the launch ends
    # (a daemon a rank started, ranks left by a killed launcher) is ended, by the reaper if the
    # launcher itself is killed.
    env[ENV_LAUNCH_ID] = new_launch_id()
    return run_and_report(plan, watchers, run_dir, console, argv, env, recorder, hangup)


def run_and_report(
    plan: LaunchPlan,
    watchers: Watchers,
    run_dir: RunDir,
    console: Console,
    argv: list[str],
    env: dict[str, str],
    recorder: NodeRecorder | None,
    hangup: Hangup,
) -> int:
    """Run the job to its end, then print how it ended; the exit code."""
    launch_id = env[ENV_LAUNCH_ID]
    # the ranks of this host say their rank here, the kernel naming their pid (rank_socket.py)
    rank_socket = RankSocket.open()
    if rank_socket is not None:
        env = {**env, ENV_RANK_SOCKET: str(rank_socket.path)}
    try:
        reaper = Reaper(
            launch_id,
            run_dir=str(run_dir.path),
            node_rank=plan.node_rank,
            socket_dir=rank_socket.directory if rank_socket is not None else None,
        )
    except BaseException:
        if rank_socket is not None:
            rank_socket.close()
        raise
    try:
        outcome, agent_exits = run_job(
            plan,
            watchers,
            run_dir,
            console,
            argv,
            env,
            recorder=recorder,
            hangup=hangup,
            rank_socket=rank_socket,
        )
    finally:
        end_marked(launch_id)
        reaper.close()
        if rank_socket is not None:
            rank_socket.close()
    code = exit_code_for(outcome)
    if recorder is not None:
        recorder.ended(int(code), outcome.job_returncode, time.time())
    for text in closing_lines(outcome, agent_exits, run_dir=run_dir, exit_code=code):
        console.print(text, highlight=False, markup=False)
    if plan.json:
        sys.stdout.write(jsontext.dumps(json_document(outcome, agent_exits, code), indent=2) + "\n")
        sys.stdout.flush()
    return int(code)


def node_recorder(plan: LaunchPlan, run_dir: RunDir, log_dir: Path) -> NodeRecorder | None:
    """This launcher's node record, for a job that spans nodes (None for one node)."""
    if plan.node_rank is None:
        return None
    record = NodeRecord(
        node_rank=plan.node_rank,
        host=socket.gethostname(),
        launcher_pid=os.getpid(),
        log_dir=str(log_dir.relative_to(run_dir.path)),
        nproc=plan.nproc_per_node,
    )
    return NodeRecorder(run_dir, record)


def run_job(
    plan: LaunchPlan,
    watchers: Watchers,
    run_dir: RunDir,
    console: Console,
    argv: list[str],
    env: dict[str, str],
    *,
    recorder: NodeRecorder | None = None,
    hangup: Hangup | None = None,
    rank_socket: RankSocket | None = None,
) -> tuple[RunOutcome, dict[int, Any]]:
    """Start torchrun, watch it through the TUI or the headless view, make sure it has ended, and
    print the final diagnosis. Returns the outcome and torchrun's report of each rank's exit.
    `rank_socket`: where the ranks say their rank (its path already in `env`)."""
    use_tui = watchers.tui is not None and plan.tui_allowed and tui_capable()
    lines: queue.Queue[str] = queue.Queue()
    agent = AgentLogParser()
    agent_lock = threading.Lock()

    def on_agent_line(line: str) -> None:
        with agent_lock:
            agent.feed(line)

    log_dir = run_dir.node_logs_dir(plan.node_rank)
    job = TorchrunProcess(
        argv,
        env,
        agent_log=log_dir / "torchrun.log",
        on_line=None if use_tui else lines.put,
        on_agent_line=on_agent_line,
        log_dir=log_dir,
        run_root=run_dir.path,
    )
    node = plan.node_rank
    # A follower's view someone looks at (the TUI, a live terminal view) shows every node's ranks.
    watched = use_tui or console.is_terminal
    monitor = watchers.monitor(
        run_dir,
        hang_after=plan.hang_after,
        node_rank=node,
        follow_all_nodes=watched and node not in (None, 0),
        rank_socket=rank_socket,
    )
    policy = StopPolicy(
        keep_running=plan.keep_running,
        follower=node not in (None, 0),
        stop_on_divergence=plan.stop_on_divergence,
    )
    supervised = SupervisedRun(
        monitor,
        job,
        policy,
        on_stop=(lambda verdict: recorder.stopped(verdict.value)) if recorder else None,
        responder=StackResponder(run_dir, node) if node is not None else None,
    )
    # After the TUI has closed, the same diagnosis is printed once more as plain text.
    view = watchers.headless(console, live=console.is_terminal and not use_tui)
    interrupts = Interrupts(monitor=monitor, recorder=recorder)
    relay = None
    try:
        job.start()
        if plan.command is not None and node is None:  # a Ray job's other nodes, through Ray
            relay = RelayProcess.start(run_dir, env)
        if recorder is not None:
            recorder.started(job.pid, time.time())
        with forward_signals(job, interrupts, leave_tui=use_tui):
            if use_tui and watchers.tui is not None:
                # A signal ends the app by KeyboardInterrupt (Textual restores the terminal).
                with contextlib.suppress(KeyboardInterrupt):
                    try:  # a hangup leaves the app only while it runs (never the job's watch)
                        if hangup is not None:
                            hangup.in_tui = True
                        title = f"ddpdoctor run: {plan.job_name}"
                        watchers.tui(supervised, mode="run", job=job, title=title)
                    finally:
                        if hangup is not None:
                            hangup.in_tui = False
                if hangup is not None and hangup.happened and interrupts.signum is None:
                    # The terminal went away, not the user: the job goes on, watched.
                    watch_headless(supervised, job, view, lines)
            else:
                watch_headless(supervised, job, view, lines)
        end_job(job)
        if relay is not None:
            relay.finish()  # the other nodes' last events in, before the last look
    finally:
        job.kill()
        if relay is not None:
            relay.kill()
    launcher = launcher_name(plan)
    final = monitor.close(
        job_ended=job.returncode() is not None,
        interrupted=interrupts.signum is not None,
        verdict_before=interrupts.verdict_before,
        job_exit=job.returncode(),
        launcher=launcher,
    )
    view.close(final)
    write_error = getattr(monitor, "write_error", None)
    if write_error:
        console.print(f"ddpdoctor: warning: {write_error}", markup=False, soft_wrap=True)
    outcome = RunOutcome(
        final=final,
        job_returncode=job.returncode(),
        stopped_for=supervised.stopped_for,
        interrupted=interrupts.signum is not None,
        abandoned_by=supervised.abandoned_by,
        launcher=launcher,
    )
    with agent_lock:
        return outcome, dict(agent.exits)


def watch_headless(
    supervised: SupervisedRun, job: TorchrunProcess, view: Any, lines: queue.Queue[str]
) -> None:
    """Pass the job's output through and poll the monitor until torchrun has exited."""
    view.update(supervised.poll())
    next_poll = time.monotonic() + POLL_S
    while job.returncode() is None:
        try:
            view.job_output(lines.get(timeout=max(0.0, next_poll - time.monotonic())))
            continue
        except queue.Empty:
            pass
        view.update(supervised.poll())
        next_poll = time.monotonic() + POLL_S
    job.wait_output(timeout=10.0)
    with contextlib.suppress(queue.Empty):
        while True:
            view.job_output(lines.get_nowait())
    view.update(supervised.poll())


def end_job(job: TorchrunProcess) -> None:
    """The views return when the job ended, or the user quit the TUI: then the job must end too."""
    if job.returncode() is None:
        job.stop()
        job.wait(timeout=STOP_GRACE_S + 5.0)


@contextlib.contextmanager
def forward_signals(
    job: TorchrunProcess, interrupts: Interrupts, *, leave_tui: bool = False
) -> Iterator[None]:
    """Ctrl-C and SIGTERM to the launcher go to the job (it runs in its own session). Under the
    TUI (where Ctrl-C is a key, so a signal comes from outside) the app is left at once too."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: Any) -> None:
        first = interrupts.signum is None
        interrupts.note(signum)
        job.interrupt(signum)
        if leave_tui and first:
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def launcher_name(plan: LaunchPlan) -> str:
    """ "torchrun" (ddpdoctor's own), or the user's command as it was given: "python train.py"
    (an mp.spawn parent), "torchrun", "accelerate launch", "srun"."""
    if plan.command is None or plan.command.kind == "torchrun":  # python -m torch.distributed.run
        return "torchrun"
    argv = plan.command.argv
    words = [os.path.basename(argv[0]), *argv[1 : 3 if argv[1:2] == ("-m",) else 2]]
    return " ".join(words)[:80]
