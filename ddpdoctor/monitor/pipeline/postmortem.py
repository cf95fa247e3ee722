"""Post-mortems of a run directory: the final diagnosis read from the files alone, and the logs'
findings told in the light of what ddpdoctor itself did to the job (its own stop)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ddpdoctor.findings import Evidence, Finding, Severity, sort_findings
from ddpdoctor.monitor.judge.diagnose import reports_the_stop
from ddpdoctor.monitor.model.snapshot import Snapshot
from ddpdoctor.monitor.pipeline.live import Monitor
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.rundir import RunDir


def diagnose_run_dir(
    path: str | os.PathLike[str] | Path, *, hang_after: float | None = None
) -> Snapshot:
    """The post-mortem of a finished run or a copied run directory (reads everything once;
    writes nothing). A run directory that is not one raises UsageError."""
    monitor = Monitor(path, hang_after=hang_after, capture_stacks=False, write_diagnosis=False)
    return monitor.close()


# What the other ranks and nodes log once ddpdoctor has stopped a hung job: a peer's socket closes,
# a node's agent finds the store host gone. In a job that had reached its collectives (a hang or
# mismatch needs that) these follow from the stop, so they are told as such, not as errors.
AFTER_THE_STOP = frozenset(
    {
        "gloo.peer_closed",
        "nccl.remote_error",
        "watchdog.teardown",
        "torchrun.sigterm_peers",
        "c10d.connect_timeout",
        "c10d.connect_failed",
        "c10d.store_wait_timeout",
    }
)


def without_ddpdoctors_own_stop(findings: Sequence[Finding], paths: Sequence[str]) -> list[Finding]:
    """In a run directory whose job ddpdoctor stopped after a hang or mismatch, torchrun's report
    of ranks "terminated (SIGTERM) from outside" is that stop, not the fault: the run's own
    diagnosis (diagnosis.json, which records the stop as its crash.consequence finding) takes
    its place, so the culprit is named rather than the ranks ddpdoctor stopped. What the ranks
    and agents logged because of the stop (AFTER_THE_STOP) stays, as information."""
    stop = next((s for s in map(_stop_in_run_dir, paths) if s is not None), None)
    if stop is None or not any(reports_the_stop(f) for f in findings):
        return list(findings)
    verdict, headline, where = stop
    note = Finding(
        id="run.diagnosis",
        severity=Severity.ERROR,
        summary=f"ddpdoctor diagnosed a {verdict} in this run and stopped the job: "
        f"{headline.summary}; the ranks torchrun reports as terminated by SIGTERM are that stop",
        fix=headline.fix,
        ranks=headline.ranks,
        evidence=(Evidence(f"{where}: verdict {verdict}"), *headline.evidence),
    )
    rest = [_after_the_stop(f) for f in findings if not reports_the_stop(f)]
    return [note, *sort_findings(rest)]


def _after_the_stop(finding: Finding) -> Finding:
    if finding.id not in AFTER_THE_STOP:
        return finding
    return replace(
        finding,
        severity=Severity.INFO,
        summary=f"after ddpdoctor stopped the job (a consequence): {finding.summary}",
    )


def _stop_in_run_dir(path: str) -> tuple[str, Finding, Path] | None:
    """(verdict, its headline finding, diagnosis.json) when `path` is a run directory whose job
    ddpdoctor stopped after a hang or mismatch."""
    diagnosis = RunDir(Path(path)).diagnosis_json
    try:
        doc = jsontext.read(diagnosis)
        found = [Finding.from_json(f) for f in doc.get("findings") or ()]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    verdict = doc.get("verdict")
    if verdict not in ("hang", "mismatch") or not found:
        return None
    if not any(f.id == "crash.consequence" for f in found):
        return None
    return verdict, found[0], diagnosis
