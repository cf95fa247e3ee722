"""The log explainers' reports of a rank's end, weighed against what ddpdoctor observed.

The explainers read text (ddpdoctor.protocol.trust: LAUNCHER or JOB origin). A report that a
rank was killed, ended by a signal or failed (torchrun's failure table, as any rank or command
can print it) is kept as it is while it agrees with ddpdoctor's own observation; when the rank it
names finished cleanly (its exit event said code 0) or its process runs, the report is the
job's text, not a fact: it stays visible, quoted, as information that was not acted on.

ddpdoctor's own failures are not the job's either: a Python exception raised in ddpdoctor's
launch code (the guard around a user's command writes into the job's output) is reported as
ddpdoctor's internal error, never as an exception of the user's job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.model.snapshot import RankState, RankView, Snapshot

# The explainers' findings that say a rank ended (ddpdoctor.explain.torchrun).
EXIT_REPORTS = frozenset({"torchrun.killed", "torchrun.signal", "torchrun.failed"})
# Code of ddpdoctor's that runs around the job, never in it: its frames are ddpdoctor's own.
_OWN_FRAME = re.compile(r'File "[^"]*/ddpdoctor/launch/[^"/]+\.py"')
INTERNAL = "ddpdoctor.internal"


def ddpdoctors_own(finding: Finding) -> Finding:
    """A traceback raised in ddpdoctor's launch code, told as ddpdoctor's, not the job's."""
    if finding.id != "python.exception":
        return finding
    if not any(_OWN_FRAME.search(e.text[:2000]) for e in finding.evidence):
        return finding
    return replace(
        finding,
        id=INTERNAL,
        severity=Severity.WARNING,
        summary=f"ddpdoctor's own launch code failed (not your job): {finding.summary}",
        fix="Nothing to fix in your job. Please report this error of ddpdoctor's, with the "
        "lines above.",
    )


def _contradiction(view: RankView) -> str | None:
    """How ddpdoctor saw this rank, where that contradicts a report of its failure."""
    if view.state is RankState.DONE and view.exit_code == 0:
        return f"rank {view.rank} finish normally (exit code 0)"
    if view.alive is True and not view.state.finished:
        return f"rank {view.rank}'s process (pid {view.pid}) running"
    return None


def _views_now(snap: Snapshot) -> dict[int, RankView]:
    """The views of the ranks whose process now is the one a report of their exit is about."""
    views = {view.rank: view for view in snap.ranks}
    if snap.attempts is not None:  # a report of an earlier attempt's process is not about
        for attempt in snap.attempts.ended:  # the rank's process now
            for ending in attempt.failures:
                views.pop(ending.rank, None)
    return views


def weigh_exit_reports(findings: Iterable[Finding], snap: Snapshot) -> list[Finding]:
    views: dict[int, RankView] | None = None  # (made once a report needs them, not every poll)
    weighed = []
    for finding in map(ddpdoctors_own, findings):
        if finding.id in EXIT_REPORTS and finding.severity is not Severity.INFO:
            if views is None:
                views = _views_now(snap)
            seen = [
                c
                for c in (_contradiction(views[r]) for r in finding.ranks if r in views)
                if c is not None
            ]
            if seen:
                finding = replace(
                    finding,
                    severity=Severity.INFO,
                    summary=(
                        f"not acted on: text in the job's output reports that {finding.summary}"
                        f" — but ddpdoctor saw {', '.join(seen)}"
                    ),
                    fix="Nothing to fix, unless your job prints torchrun's reports itself: "
                    "ddpdoctor acts only on what it observes (processes, exit statuses, the "
                    "ranks' events), never on text a job prints.",
                )
        weighed.append(finding)
    return weighed
