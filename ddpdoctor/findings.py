"""A finding: one thing ddpdoctor noticed, with its fix and the evidence for it.

Used by the log explainers (`ddpdoctor explain`) and by the monitor's diagnoses. The JSON form is
part of the public contract (DESIGN.md): {"id", "severity", "summary", "fix", "ranks", "evidence"}.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """Higher is worse; used to sort findings worst first."""
        return {"info": 0, "warning": 1, "error": 2}[self.value]


@dataclass(frozen=True)
class Evidence:
    """A line that supports a finding. `file` and `line` are None for evidence not read from a file."""

    text: str
    file: str | None = None
    line: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "text": self.text}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Evidence:
        return cls(text=str(data.get("text", "")), file=data.get("file"), line=data.get("line"))


@dataclass(frozen=True)
class Finding:
    id: str
    severity: Severity
    summary: str
    fix: str
    ranks: tuple[int, ...] = ()
    evidence: tuple[Evidence, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity.value,
            "summary": self.summary,
            "fix": self.fix,
            "ranks": list(self.ranks),
            "evidence": [e.to_json() for e in self.evidence],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        return cls(
            id=str(data["id"]),
            severity=Severity(data.get("severity", "info")),
            summary=str(data.get("summary", "")),
            fix=str(data.get("fix", "")),
            ranks=tuple(int(r) for r in data.get("ranks", ())),
            evidence=tuple(Evidence.from_json(e) for e in data.get("evidence", ())),
        )


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Worst first, then by id, so output order is stable."""
    return sorted(findings, key=lambda f: (-f.severity.rank, f.id))
