"""How `ddpdoctor run` ends: the exit code that follows the verdict, the closing lines (each
rank that did not end cleanly, why the job stopped, the run directory, the verdict) and the
`--json` document. Pure functions of the run's outcome."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddpdoctor.console import one_line
from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.protocol.torchrun_logs import signal_name
from ddpdoctor.protocol.trust import Origin, agent_log_origin
from ddpdoctor.protocol.verdicts import RankState, Verdict
from ddpdoctor.rank_ranges import named_ranks

if TYPE_CHECKING:  # pragma: no cover - the command supplies the monitor and its snapshots
    from ddpdoctor.monitor.model.snapshot import Snapshot


@dataclass(frozen=True)
class RunOutcome:
    final: Snapshot
    job_returncode: int | None
    stopped_for: Verdict | None
    interrupted: bool
    abandoned_by: int | None = None  # the node whose launcher never started its part
    launcher: str = "torchrun"  # what started the ranks, as the closing lines name it

    @property
    def started(self) -> bool:
        """False when the job never got past the rendezvous: a node's launcher gave up before
        starting its part, or a node never joined at all."""
        return self.abandoned_by is None and not self.final.never_started


RAN_ALONE = frozenset({Verdict.NOT_DISTRIBUTED, Verdict.NOT_INSTRUMENTED})


def own_exit_code(returncode: int | None) -> int:
    """The job's own exit status as a shell would report it (a signal N: 128 + N)."""
    if returncode is None:
        return int(ExitCode.OK)
    return 128 - returncode if returncode < 0 else returncode & 0xFF


def exit_code_for(outcome: RunOutcome) -> int:
    """The exit code follows the verdict (verdict_agrees says how), then the job's own code. A
    command that ran without any rank (nothing was watched, nothing judged) exits with its own
    code, as if ddpdoctor were not there: 3 stays 3, for the scripts and schedulers that read it."""
    if outcome.interrupted or outcome.final.verdict is Verdict.INTERRUPTED:
        return ExitCode.INTERRUPTED
    if outcome.final.verdict in RAN_ALONE and outcome.stopped_for is None:
        return own_exit_code(outcome.job_returncode)
    if outcome.stopped_for is not None or outcome.final.verdict.is_problem:
        return ExitCode.PROBLEMS
    if outcome.abandoned_by is not None:
        return ExitCode.PROBLEMS
    if outcome.job_returncode not in (0, None):
        return ExitCode.PROBLEMS
    return ExitCode.OK


def verdict_agrees(verdict: Verdict, code: int, job_returncode: int | None) -> bool:
    """The printed verdict and the exit code never contradict each other: healthy exits 0 and
    only with a job that exited 0; a problem exits 1; interrupted exits 130; a command that ran
    without ranks (not distributed, not instrumented) exits with the command's own code."""
    if verdict is Verdict.HEALTHY:
        return code == ExitCode.OK and job_returncode in (0, None)
    if verdict.is_problem:
        return code == ExitCode.PROBLEMS
    if verdict is Verdict.INTERRUPTED:
        return code == ExitCode.INTERRUPTED
    if verdict in RAN_ALONE:
        return code == own_exit_code(job_returncode)
    return code in (ExitCode.OK, ExitCode.PROBLEMS)


def rank_exit_lines(final: Snapshot, agent_exits: dict[int, Any]) -> list[str]:
    """One line per rank that did not end cleanly, from its events, else from torchrun's table."""
    lines: list[str] = []
    described: set[int] = set()
    for rank in final.ranks:
        signame = rank.exit_signal or signal_name(rank.exit_code)
        if rank.exit_code not in (None, 0):
            how = f"ended by {signame}" if signame else f"exited with code {rank.exit_code}"
            lines.append(f"rank {rank.rank} {how}")
        elif rank.state is RankState.GONE:
            lines.append(
                f"rank {rank.rank} died without an exit event"
                + (f" ({signame})" if signame else "")
            )
        else:
            continue
        described.add(rank.rank)
    views = {view.rank: view for view in final.ranks}
    origin = agent_log_origin(final.run.launch_mode)
    for exit_ in sorted(agent_exits.values(), key=lambda e: (e.rank is None, e.rank or 0)):
        if exit_.rank is None or exit_.rank in described or exit_.exit_code == 0:
            continue
        view = views.get(exit_.rank)
        if view is not None and (view.state is RankState.DONE or view.alive is True):
            continue  # ddpdoctor saw it finish, or run: the table's word is not a fact (trust.py)
        if view is None and origin is Origin.JOB:
            continue  # a rank ddpdoctor never saw, named only by the job's output
        how = f"ended by {exit_.signal}" if exit_.signal else f"exited with code {exit_.exit_code}"
        lines.append(f"rank {exit_.rank} {how} (torchrun)")
        described.add(exit_.rank)
    return lines


def closing_lines(
    outcome: RunOutcome, agent_exits: dict[int, Any], *, run_dir: RunDir, exit_code: int
) -> list[str]:
    lines = rank_exit_lines(outcome.final, agent_exits)
    if outcome.interrupted:
        lines.append("interrupted: the job was stopped")
    elif outcome.stopped_for is Verdict.INTERRUPTED:
        lines.append("interrupted on another node: this node stopped its part of the job with it")
    elif outcome.stopped_for is None and outcome.final.verdict is Verdict.INTERRUPTED:
        # This node's torchrun can end on its own first (its peers' sockets closed) before
        # the monitor stops it: the same story, told the same way.
        lines.append("interrupted on another node: this node's part of the job ended with it")
    elif outcome.stopped_for is not None:
        lines.append(f"ddpdoctor stopped the job after diagnosing a {outcome.stopped_for.value}")
    elif outcome.abandoned_by is not None:
        node = outcome.abandoned_by
        lines = [
            f"node {node}'s launcher ended before starting its part of the job (its doctor "
            f"failed: see nodes/node-{node}/doctor.json), so the rendezvous could never "
            "complete: this node stopped its torchrun instead of waiting for the rendezvous "
            "timeout"
        ]
    elif outcome.final.never_started and outcome.final.nodes_missing:
        nodes = named_ranks(outcome.final.nodes_missing, "node")
        lines = [
            f"{nodes} never joined the rendezvous, so torchrun started no rank (its launcher "
            "never wrote to this run directory): start it with the same options and --run-dir, "
            "or check that it reaches the rendezvous endpoint"
        ]
    elif outcome.final.verdict in (
        Verdict.NOT_STARTED,
        Verdict.NOT_DISTRIBUTED,
        Verdict.NOT_INSTRUMENTED,
    ):
        lines = []  # the reason is the view's headline already: said once
    ran_alone = outcome.final.verdict in RAN_ALONE
    if outcome.job_returncode is not None and (
        (not lines and outcome.job_returncode != 0) or ran_alone
    ):
        code = outcome.job_returncode
        signame = signal_name(code) if code < 0 else None
        how = f"was ended by {signame}" if signame else f"exited with code {code}"
        lines.append(f"{outcome.launcher} {how}")
    lines.append(f"run directory: {one_line(str(run_dir.path))}")
    verdict = (
        "not started" if not outcome.started else outcome.final.verdict.value.replace("_", " ")
    )
    lines.append(f"verdict: {verdict} (exit code {int(exit_code)})")
    return lines


def json_document(outcome: RunOutcome, agent_exits: dict[int, Any], code: int) -> dict[str, Any]:
    """The final diagnosis (diagnosis.json) plus how the job ended, for `run --json`."""
    doc = outcome.final.diagnosis_json()
    doc["job"] = {
        "exit_code": int(code),
        "started": outcome.started,
        "torchrun_exit_code": outcome.job_returncode,
        "stopped_for": outcome.stopped_for.value if outcome.stopped_for else None,
        "interrupted": outcome.interrupted,
        "abandoned_by_node": outcome.abandoned_by,
        "nodes_missing": list(outcome.final.nodes_missing),
        "rank_exits": rank_exit_lines(outcome.final, agent_exits),
    }
    return doc
