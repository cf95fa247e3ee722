"""A script checkup finding: one rule that fired at one line, with why it bites and the fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddpdoctor.findings import Evidence, Finding, Severity


@dataclass(frozen=True)
class ScriptFinding:
    """`rule`, `path` and `line` let a later diagnosis of a run cite the line that causes it."""

    rule: str  # stable id, e.g. "script.set_epoch_missing"
    severity: Severity
    path: str
    line: int
    summary: str  # what the source shows
    why: str  # what happens at run time because of it
    fix: str
    text: str = ""  # the source line, stripped
    # The lines of the `if rank == 0:` body that holds it (rank-guard findings): a rank stuck
    # anywhere in that body (a DDP forward flagged, its backward hanging) is its symptom.
    block: tuple[int, int] | None = None

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}"

    def to_finding(self) -> Finding:
        """The shared Finding form (DESIGN.md): the evidence is the source line."""
        return Finding(
            id=self.rule,
            severity=self.severity,
            summary=f"{self.summary}: {self.why}",
            fix=self.fix,
            evidence=(Evidence(text=self.text, file=self.path, line=self.line),),
        )

    def to_json(self) -> dict[str, Any]:
        return self.to_finding().to_json()
