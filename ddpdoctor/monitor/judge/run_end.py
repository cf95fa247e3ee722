"""The verdicts only an ended run gets: NOT_STARTED when no rank ever reported (and why: the
preflight blocked it, events/ cannot be read, torchrun ended first), and INTERRUPTED when the user
stopped it before any problem was found. The Monitor (ddpdoctor.monitor.pipeline.live) applies them to its
last snapshot.
"""

from __future__ import annotations

import re
import signal
from dataclasses import replace
from typing import Any

from ddpdoctor.checks.gate import refusal_findings
from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.follow.liveness import is_local, pid_alive
from ddpdoctor.monitor.judge.crash_before_init import crash_before_init
from ddpdoctor.monitor.judge.uninstrumented import ran_without_ranks
from ddpdoctor.monitor.model.snapshot import RankState, Snapshot, Verdict
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.rundir import RunDir

DISK_FULL = "run.disk_full"  # (ddpdoctor.monitor.follow.disk_space)
# Findings that say how the ranks ended: after the user stopped the run, that was the stop.
STOP_EFFECTS = frozenset({"crash", "died", "crash.consequence", "torchrun.signal"})


def interrupted_snapshot(snap: Snapshot) -> Snapshot:
    """The user stopped the run before a problem was found: INTERRUPTED, without the findings
    that only describe the stop (the ranks ended by the signal)."""
    note = Finding(
        "run.interrupted",
        Severity.INFO,
        "stopped by the user (Ctrl-C or SIGTERM to ddpdoctor run)",
        "Nothing to fix: rerun to let the job finish.",
    )
    kept = tuple(f for f in snap.findings if f.id not in STOP_EFFECTS)
    return replace(
        snap,
        verdict=Verdict.INTERRUPTED,
        findings=(note, *kept),
        culprits=frozenset(),
        detected_after_s=None,
        finished=True,
        confirmed=False,  # nothing was found: the crash the stop looked like is no verdict
    )


def not_started_snapshot(snap: Snapshot, run: RunDir, events_dir_error: str | None) -> Snapshot:
    """An ended run in which no rank ever reported: NOT_STARTED, with the reason first (nodes
    that never joined are the reason already: finding run.nodes_missing). Ranks whose logs
    show an exception raised before they joined a process group crashed (crash_before_init);
    a command that did run without a rank says so: its processes never joined a process group
    (NOT_DISTRIBUTED), or ddpdoctor's runtime could not load in them (NOT_INSTRUMENTED,
    ddpdoctor.monitor.judge.uninstrumented)."""
    refusals = doctor_refusals(run)
    if refusals:
        # the preflight refused the launch (on this node, or on another node of the job): the
        # refusing checks are the reason, whatever else is missing
        # (a node that "never joined" was never asked to: this node's torchrun never started)
        kept = tuple(f for f in snap.findings if f.id != "run.nodes_missing")
        return replace(
            snap, verdict=Verdict.NOT_STARTED, findings=(*refusals, *kept), finished=True
        )
    if not snap.nodes_missing and not events_dir_error:
        crashed = crash_before_init(snap)
        if crashed is not None:
            return crashed
        ran = ran_without_ranks(run)
        if ran is not None:
            verdict, why = ran
            return replace(snap, verdict=verdict, findings=(why, *snap.findings), finished=True)
    reason = () if snap.nodes_missing else (not_started_reason(run, events_dir_error),)
    return replace(
        snap,
        verdict=Verdict.NOT_STARTED,
        findings=(*reason, *snap.findings),
        finished=True,
    )


def not_started_reason(run: RunDir, events_dir_error: str | None) -> Finding:
    if events_dir_error:
        return Finding(
            "run.not_started",
            Severity.ERROR,
            f"no rank's record can be read: events/: {events_dir_error}",
            "Make the run directory readable to this user (or watch as its owner).",
        )
    return Finding(
        "run.not_started",
        Severity.ERROR,
        "the launch ended and no rank recorded that it started: torchrun ended before "
        "starting a rank, or the ranks could not write to events/",
        "See logs/<host>/torchrun.log (ddpdoctor explain RUN_DIR), and check that the run "
        "directory's events/ folder is writable by the job.",
    )


def doctor_refusals(run: RunDir) -> tuple[Finding, ...]:
    """The checks that refused the launch, from the run's doctor.json(s) (one node's, or each
    node's of a job over several): facts about the machine or the launch that failed or could
    not run, each a finding with its cause, fix and lines (ddpdoctor.checks.gate). The script
    checkup's findings never refused a launch and are not among them."""
    found: list[Finding] = []
    for path in [run.doctor_json, *sorted(run.nodes_dir.glob("node-*/doctor.json"))]:
        try:
            report = jsontext.read(path, root=run.path)
        except (OSError, ValueError):
            continue
        where = str(path.relative_to(run.path))
        found.extend(f for f in refusal_findings(report, where) if f not in found)
    return tuple(found)


def launcher_gone(run: RunDir, local_host: str) -> bool:
    """The launcher named in run.json ran on this host and has exited: a run that has written
    nothing by then never will."""
    data = run.read_run_json()
    pid, hosts = data.get("launcher_pid"), data.get("hosts") or []
    if not isinstance(pid, int) or not hosts or not is_local(str(hosts[0]), local_host):
        return False
    started = data.get("started_t")
    return not pid_alive(pid, started if isinstance(started, (int, float)) else None)


# Signals someone sends to stop a job (a user, a scheduler's time limit, a supervisor).
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")
_SPAWN_EXIT = re.compile(
    r"process (\d{1,7}) terminated with (?:signal (SIG[A-Z0-9]{1,10})|exit code)"
)


def launcher_exit_snapshot(snap: Snapshot, code: int | None, launcher: str | None) -> Snapshot:
    """The job's launcher exited non-zero (or died of a signal) while the ranks' own records
    say nothing failed, or only that they were stopped: the verdict follows the launcher, never
    "healthy". Killed from outside (SIGTERM, SIGINT, SIGHUP): INTERRUPTED. Otherwise a CRASH,
    blamed on the launcher (or the rank a launcher's report names), not on a rank it stopped."""
    name = launcher or "their launcher"
    # (only ever called for a crash of ranks stopped from outside, or a healthy-looking run)
    steps = [v.step for v in snap.ranks if v.step is not None]
    where = f"; the ranks stopped at step {max(steps)}" if steps else ""
    if snap.run.total_steps and steps:
        where += f" of {snap.run.total_steps}"
    signame = _signal_name(-code) if code is not None and code < 0 else None
    fix = (
        "Nothing to fix in the job if the stop was meant (a user, a scheduler's time limit); "
        "otherwise find what sent the signal."
    )
    if signame in STOP_SIGNALS:
        summary = f"the launcher ({name}) was ended by {signame} from outside ddpdoctor{where}"
        note = Finding("run.launcher_stopped", Severity.WARNING, summary, fix)
        return _ended_by(snap, Verdict.INTERRUPTED, note, frozenset())
    if stopped_from_outside(snap):
        sent = sorted({v.exit_signal for v in snap.ranks if v.exit_signal})
        exited = f" ({name} exited with code {code})" if code not in (0, None) else ""
        at = f" at step {max(steps)}" if steps else ""
        summary = (
            f"the ranks were ended by {'/'.join(s or '?' for s in sent)} from outside ddpdoctor"
            f"{at}: {name} was stopped, or a scheduler or a user signalled the job{exited}"
        )
        note = Finding("run.launcher_stopped", Severity.WARNING, summary, fix)
        return _ended_by(snap, Verdict.INTERRUPTED, note, frozenset())
    if code in (0, None):
        return snap
    culprits: frozenset[int] = frozenset()
    reported = None
    for finding in snap.findings:
        match = _SPAWN_EXIT.search(finding.summary)
        if match:
            culprits = frozenset({int(match.group(1))})
            reported = finding.summary
            break
    how = f"was killed by {signame}" if signame else f"exited with code {code}"
    clean = "" if signame or reported else ", although every rank recorded a clean exit"
    if not reported and any(f.id == DISK_FULL for f in snap.findings):
        clean = (
            "; how each rank ended is not recorded: the run directory could not take their "
            f"exit events ({DISK_FULL})"
        )
    summary = f"the launcher ({name}) {how}{clean}{where}"
    if reported:
        summary = f"{summary}: {reported}"
    note = Finding(
        "run.launcher_failed",
        Severity.ERROR,
        summary,
        "A rank may have died after it recorded its exit (in interpreter teardown: see its log), "
        "or the launcher itself failed or was killed (the OOM killer sends SIGKILL): see "
        "logs/ and the system log.",
        ranks=tuple(sorted(culprits)),
    )
    return _ended_by(snap, Verdict.CRASH, note, culprits)


def stopped_from_outside(snap: Snapshot) -> bool:
    """Every rank has ended and the ones that failed were all ended by a stop signal, with no
    error of their own: the job was stopped (its launcher or a scheduler was), nothing crashed.
    Only a crash reads so: a hang or mismatch found in the record (a copied run directory of a
    job ddpdoctor stopped) stays what it was."""
    if not snap.ranks or not all(v.state.finished for v in snap.ranks):
        return False
    failed = [v for v in snap.ranks if v.state is not RankState.DONE]
    return bool(failed) and all(
        v.exit_signal in STOP_SIGNALS and not v.error and v.state is RankState.FAILED
        for v in failed
    )


def _ended_by(
    snap: Snapshot, verdict: Verdict, note: Finding, culprits: frozenset[int]
) -> Snapshot:
    kept = tuple(f for f in snap.findings if f.id not in STOP_EFFECTS)
    return replace(
        snap,
        verdict=verdict,
        findings=(note, *kept),
        culprits=culprits,
        detected_after_s=None,
        finished=True,
        confirmed=False,
    )


def _signal_name(signum: int) -> str | None:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return None


def ended_with_ranks(
    snap: Snapshot,
    code: int | None,
    launcher: str | None,
    killed: tuple[int, dict[str, Any] | None] | None,
) -> Snapshot:
    """The verdict of an ended run whose ranks reported, as the way it ended says: `ddpdoctor
    run` killed (`killed`: its pid and last diagnosis), the ranks stopped from outside, or a
    launcher that failed while the ranks say all is well (`code`: its exit status)."""
    if killed is not None:
        return launcher_killed_snapshot(snap, *killed)
    if (stopped_from_outside(snap) and snap.verdict is Verdict.CRASH) or (
        code not in (0, None) and snap.verdict in (Verdict.HEALTHY, Verdict.RUNNING)
    ):
        return launcher_exit_snapshot(snap, code, launcher)
    return snap


def launcher_killed_snapshot(snap: Snapshot, pid: int, previous: dict[str, Any] | None) -> Snapshot:
    """`ddpdoctor run` (pid) exited without its final diagnosis, so it was killed and the job
    was ended with it: the problem it had found stands (its last diagnosis.json), else the run
    was INTERRUPTED. How the ranks then ended (exit 0 on a swallowed signal, SIGTERM, SIGKILL)
    is the stop, never a crash of theirs nor a healthy finish."""
    steps = [v.step for v in snap.ranks if v.step is not None]
    where = f"; the ranks stopped at step {max(steps)}" if steps else ""
    note = Finding(
        "run.launcher_killed",
        Severity.WARNING,
        f"ddpdoctor run{f' (pid {pid})' if pid else ''} ended before the job did, without "
        "writing its final "
        f"diagnosis: it was killed, and the job was ended with it{where}",
        "Nothing to fix in the job: rerun it (and find what killed ddpdoctor: a closed "
        "terminal, the OOM killer, a user).",
    )
    found = _previous_problem(previous)
    if found is None:
        return _ended_by(snap, Verdict.INTERRUPTED, note, frozenset())
    verdict, culprits, first = found
    kept = tuple(f for f in snap.findings if f.id not in STOP_EFFECTS and f != first)
    return replace(
        snap,
        verdict=verdict,
        findings=(*((first,) if first else ()), note, *kept),
        culprits=culprits,
        finished=True,
        confirmed=False,
    )


def _previous_problem(
    previous: dict[str, Any] | None,
) -> tuple[Verdict, frozenset[int], Finding | None] | None:
    """The problem verdict of the last diagnosis.json the launcher wrote, if it had found one."""
    if not previous:
        return None
    try:
        verdict = Verdict(previous.get("verdict"))
        culprits = frozenset(int(r) for r in previous.get("culprits") or [])
        findings = previous.get("findings") or []
        first = (
            Finding.from_json(findings[0]) if findings and isinstance(findings[0], dict) else None
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return (verdict, culprits, first) if verdict.is_problem else None
