"""Which preflight results may refuse a launch: facts about this machine and this launch, never a
reading of the job's source.

`ddpdoctor run` runs the doctor before it starts a job. A held port, a variable that contradicts
the launch, a missing GPU for `--backend nccl`, an unreachable master: these are facts, and a
job started against them cannot work, so a failed (or unrunnable) check of that kind refuses the
launch. The script checkup (group "script") reads the source, and a static reading cannot know
which branch runs: a collective under `if args.debug_fault and rank == 0:` is a hang only in a
mode the job may never use. Its findings, whatever their severity, are printed before the launch
and kept in doctor.json, where the diagnosis cites them when the symptom appears; they never stop
a launch. `doctor --script` keeps its exit code (DoctorReport.exit_code) for CI.

A refused launch leaves diagnosis.json whose findings are the refusing checks themselves
(`refusal_findings`), read from the report's JSON form so that a watcher of the run directory
gets the same findings as the launcher that refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.findings import Evidence, Finding, Severity

STATIC_GROUPS = frozenset({"script"})  # ddpdoctor.checks.scriptcheck.doctor.GROUP
_REFUSING = frozenset({Status.FAIL.value, Status.ERROR.value})
MAX_FINDINGS = 32  # refusing checks turned into findings (a crafted report may list thousands)
MAX_DETAILS = 8  # details of one check kept as its evidence
MAX_TEXT = 2000  # characters of one summary, fix or detail


def refuses(result: CheckResult) -> bool:
    """A failed check, or one that could not run (a check that could not look is no evidence
    the job can run), about this machine or this launch; never a static reading."""
    return result.status.value in _REFUSING and result.group not in STATIC_GROUPS


def refusing(results: Iterable[CheckResult]) -> list[CheckResult]:
    return [r for r in results if refuses(r)]


def static_problems(results: Iterable[CheckResult]) -> list[CheckResult]:
    """The script checkup's warnings and errors: shown before the launch, never a refusal."""
    return [
        r for r in results if r.group in STATIC_GROUPS and r.status.value not in ("pass", "skip")
    ]


def refusal_findings(report: Any, where: str = "doctor.json") -> list[Finding]:
    """The refusing checks of one doctor report (its JSON form) as findings: the check's summary
    (the cause), its fix, and its details as evidence lines of `where` (the report's path in the
    run directory). [] for anything that is not a report, or one that refuses nothing."""
    results = report.get("results") if isinstance(report, Mapping) else None
    findings: list[Finding] = []
    for result in results if isinstance(results, list) else ():
        if len(findings) >= MAX_FINDINGS:
            break
        finding = _finding(result, where)
        if finding is not None:
            findings.append(finding)
    return findings


def _finding(result: Any, where: str) -> Finding | None:
    if not isinstance(result, Mapping):
        return None
    status, group, check_id = result.get("status"), result.get("group"), result.get("id")
    if status not in _REFUSING or group in STATIC_GROUPS or not isinstance(check_id, str):
        return None
    title = _text(result.get("title")) or check_id
    summary = _text(result.get("summary"))
    cause = f"{title}: {summary}" if summary else title
    if status == Status.ERROR.value:
        cause = f"{cause} (the check could not run)"
    details = result.get("details")
    evidence = [
        Evidence(file=where, text=_text(detail))
        for detail in (details if isinstance(details, list) else [])[:MAX_DETAILS]
        if _text(detail)
    ]
    evidence.insert(0, Evidence(file=where, text=f"{check_id}: {status}"))
    fix = _text(result.get("fix")) or "See `ddpdoctor doctor` for this check."
    return Finding(
        id=f"preflight.{check_id}"[:200],
        severity=Severity.ERROR,
        summary=f"the preflight refused the launch: {cause}"[:MAX_TEXT],
        fix=fix,
        evidence=tuple(evidence),
    )


def _text(value: Any) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""
