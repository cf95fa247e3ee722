"""The verdict a launcher stopped the job for, held as the verdict from then on.

A job ddpdoctor stopped for a confirmed problem keeps that verdict and its culprits: what the
ranks do as they are stopped (a framework's SIGTERM handler running one more collective, a peer's
"Connection closed by peer", a rank's runtime closing its step at exit) is the stop's consequence,
never diagnosed anew (ddpdoctor.monitor.judge.diagnose, `held`). The launcher's Monitor holds the
outcome it saw; a launcher that follows another node's stop without having seen the problem holds
the bare verdict; a watcher holds what the launcher's final diagnosis.json says it stopped for,
or, without it (a run directory mailed in without it, a launcher killed before its final word),
what RUN_DIR/stopped.json says: the launcher writes it when it stops the job (`stop_file`). A job
stopped at the sooner threshold leaves evidence that a later reading cannot always tell again:
its ranks were ended by the stop, and a post-mortem would read them as stopped from outside.
"""

from __future__ import annotations

from typing import Any

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome
from ddpdoctor.monitor.model.snapshot import Verdict


def stopped_by_peer(verdict: Verdict) -> RuleOutcome:
    """The outcome of a launcher that stopped its part because another node's launcher did."""
    return RuleOutcome(
        rule="stop",
        verdict=verdict,
        confirmed=True,
        findings=(
            Finding(
                "run.stopped",
                Severity.ERROR,
                f"another node's launcher stopped the job for a {verdict.value}",
                "See the diagnosis of node 0's launcher (diagnosis.json).",
            ),
        ),
    )


def stop_record(held: RuleOutcome | None) -> dict[str, Any] | None:
    """diagnosis.json `stopped_for`: the verdict and culprits the launcher stopped the job for."""
    if held is None or held.verdict is None:
        return None
    return {"verdict": held.verdict.value, "culprits": sorted(held.culprits)}


def stop_file(held: RuleOutcome) -> dict[str, Any] | None:
    """RUN_DIR/stopped.json: the verdict, culprits and first finding the job was stopped for."""
    record = stop_record(held)
    if record is None:
        return None
    first = [held.findings[0].to_json()] if held.findings else []
    return {"schema_version": 1, "stopped_for": record, "findings": first}


def held_by_stop_file(record: dict[str, Any] | None) -> RuleOutcome | None:
    """The verdict RUN_DIR/stopped.json says the launcher stopped the job for."""
    if not record or record.get("schema_version") != 1:
        return None
    return held_by_launcher({**record, "final": True})


def held_by_launcher(previous: dict[str, Any] | None) -> RuleOutcome | None:
    """The verdict a launcher's final diagnosis.json says it stopped the job for: a watcher
    keeps it too (with its findings), instead of diagnosing the stop anew."""
    if not previous or previous.get("final") is not True:
        return None
    stopped = previous.get("stopped_for")
    if not isinstance(stopped, dict):
        return None
    try:
        verdict = Verdict(stopped.get("verdict"))
        culprits = frozenset(int(r) for r in stopped.get("culprits") or [])
        first = next(iter(previous.get("findings") or []), None)
        findings = (Finding.from_json(first),) if isinstance(first, dict) else ()
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return RuleOutcome(
        rule="stop", verdict=verdict, culprits=culprits, findings=findings, confirmed=True
    )
