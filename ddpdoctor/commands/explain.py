"""`ddpdoctor explain [--json] FILE...`: say what went wrong in NCCL / torch / torchrun / gloo logs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ddpdoctor.console import make_console, stream_is_unicode, symbols_for
from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.findings import Evidence, Finding, Severity, sort_findings
from ddpdoctor.monitor.explain.engine import explain_paths
from ddpdoctor.monitor.explain.render import render_findings
from ddpdoctor.rundir import RunDir

SCHEMA_VERSION = 1


def main(args: argparse.Namespace) -> int:
    result = explain_paths(args.files)  # a missing or unreadable file raises UsageError: exit 2
    findings = without_ddpdoctors_own_stop(result.findings, args.files)
    if args.json:
        document = {"schema_version": SCHEMA_VERSION, "findings": [f.to_json() for f in findings]}
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        render_findings(
            findings,
            make_console(),
            files=result.files,
            lines=result.lines,
            symbols=symbols_for(sys.stdout),
            unicode=stream_is_unicode(sys.stdout),
        )
    failed = any(f.severity is Severity.ERROR for f in findings)
    return int(ExitCode.PROBLEMS if failed else ExitCode.OK)


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
    from ddpdoctor.monitor.diagnose import reports_the_stop

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
        doc = json.loads(diagnosis.read_text())
        found = [Finding.from_json(f) for f in doc.get("findings") or ()]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    verdict = doc.get("verdict")
    if verdict not in ("hang", "mismatch") or not found:
        return None
    if not any(f.id == "crash.consequence" for f in found):
        return None
    return verdict, found[0], diagnosis
