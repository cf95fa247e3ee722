"""The verdicts only an ended run gets: NOT_STARTED when no rank ever reported (and why: the
preflight blocked it, events/ cannot be read, torchrun ended first), and INTERRUPTED when the user
stopped it before any problem was found. The Monitor (ddpdoctor.monitor.live) applies them to its
last snapshot.
"""

from __future__ import annotations

import json
from dataclasses import replace

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.liveness import is_local, pid_alive
from ddpdoctor.monitor.snapshot import Snapshot, Verdict
from ddpdoctor.protocol.rundir import RunDir

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
    that never joined are the reason already: finding run.nodes_missing)."""
    reason = () if snap.nodes_missing else (not_started_reason(run, events_dir_error),)
    return replace(
        snap,
        verdict=Verdict.NOT_STARTED,
        findings=(*reason, *snap.findings),
        finished=True,
    )


def not_started_reason(run: RunDir, events_dir_error: str | None) -> Finding:
    doctor = doctor_failures(run)
    if doctor:
        return Finding(
            "run.not_started",
            Severity.ERROR,
            f"the preflight doctor found {doctor}, so the job was not started",
            "Apply the fixes in doctor.json (ddpdoctor doctor shows them), or rerun with "
            "--no-doctor to launch anyway.",
        )
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


def doctor_failures(run: RunDir) -> str | None:
    """'2 failed checks' from the run's doctor.json(s), when its preflight blocked it."""
    paths = [run.doctor_json, *sorted(run.nodes_dir.glob("node-*/doctor.json"))]
    for path in paths:
        try:
            counts = json.loads(path.read_text()).get("counts", {})
            failed, errors = int(counts.get("fail", 0)), int(counts.get("error", 0))
        except (OSError, ValueError, AttributeError, TypeError):
            continue
        parts = [f"{failed} failed check(s)"] if failed else []
        parts += [f"{errors} check(s) that could not run"] if errors else []
        if parts:
            return " and ".join(parts) + f" ({path.relative_to(run.path)})"
    return None


def launcher_gone(run: RunDir, local_host: str) -> bool:
    """The launcher named in run.json ran on this host and has exited: a run that has written
    nothing by then never will."""
    data = run.read_run_json()
    pid, hosts = data.get("launcher_pid"), data.get("hosts") or []
    if not isinstance(pid, int) or not hosts or not is_local(str(hosts[0]), local_host):
        return False
    started = data.get("started_t")
    return not pid_alive(pid, started if isinstance(started, (int, float)) else None)
