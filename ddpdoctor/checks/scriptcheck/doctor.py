"""The checkup as doctor results: group "script", one result per warning or error finding, one per
script that passed (its info notes in the details), so text, JSON and JUnit show it like any check.
A script with problems keeps its info notes too, in its first problem's `facts.notes`: a run's
diagnosis cites them (a fixed MASTER_PORT when the port turns out taken), so doctor.json holds
every finding of the checkup.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.checks.scriptcheck.check import check_scripts
from ddpdoctor.checks.scriptcheck.finding import ScriptFinding
from ddpdoctor.checks.scriptcheck.rules_gpu import GPU_WITHOUT_GPU
from ddpdoctor.findings import Severity

GROUP = "script"
_STATUS = {Severity.ERROR: Status.FAIL, Severity.WARNING: Status.WARN, Severity.INFO: Status.PASS}


def script_results(paths: Iterable[str], *, no_gpu: str | None = None) -> list[CheckResult]:
    """`no_gpu`: why the job will see no GPU (the doctor's GPU facts), when it will see none."""
    paths = [str(p) for p in paths]
    findings = check_scripts(paths, no_gpu=no_gpu is not None)
    if no_gpu is not None:
        findings = [_with_machine(f, no_gpu) for f in findings]
    results: list[CheckResult] = []
    for path in paths:
        mine = [f for f in findings if f.path == path or _imported_by(f, path, paths)]
        problems = [f for f in mine if f.severity is not Severity.INFO]
        notes = [f for f in mine if f.severity is Severity.INFO]
        results.extend(_result(f, notes if i == 0 else ()) for i, f in enumerate(problems))
        if not problems:
            results.append(_passed(path, notes))
    return results


def _with_machine(finding: ScriptFinding, no_gpu: str) -> ScriptFinding:
    """A GPU finding says what the machine lacks (the probe's reason)."""
    if finding.rule != GPU_WITHOUT_GPU:
        return finding
    return replace(finding, why=f"{finding.why}; this machine: {no_gpu}")


def _imported_by(finding: ScriptFinding, path: str, paths: list[str]) -> bool:
    """A finding in a local module goes with the first script given (it is reported once)."""
    return finding.path not in paths and path == paths[0]


def _result(finding: ScriptFinding, notes: Sequence[ScriptFinding] = ()) -> CheckResult:
    facts: dict[str, Any] = {
        "finding": finding.to_json(),
        "rule": finding.rule,
        "path": finding.path,
        "line": finding.line,
    }
    if finding.block is not None:
        facts["block"] = list(finding.block)  # the `if rank == 0:` body around it
    if notes:
        facts["notes"] = [n.to_json() for n in notes]
    return CheckResult(
        id=finding.rule,
        group=GROUP,
        title=finding.location,
        status=_STATUS[finding.severity],
        summary=f"{finding.summary} [{finding.rule}]",
        details=(f"line {finding.line}: {finding.text}", f"why: {finding.why}"),
        fix=finding.fix,
        facts=facts,
    )


def _passed(path: str, notes: list[ScriptFinding]) -> CheckResult:
    extra = f" ({len(notes)} note{'s' if len(notes) != 1 else ''}, see -v)" if notes else ""
    return CheckResult(
        id="script.checkup",
        group=GROUP,
        title=path,
        status=Status.PASS,
        summary=f"no DDP pitfalls found in the source{extra}",
        details=tuple(f"info {n.location} [{n.rule}] {n.summary}: {n.fix}" for n in notes),
        facts={"path": path, "findings": [n.to_json() for n in notes]},
    )
