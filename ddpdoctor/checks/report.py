"""The doctor's report: its results, counts, exit code, and the JSON of DESIGN.md."""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ddpdoctor._version import __version__
from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.exit_codes import ExitCode

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class DoctorReport:
    results: tuple[CheckResult, ...]
    host: str
    version: str = __version__
    strict: bool = False
    elapsed_s: float = 0.0  # wall time of the whole run (checks run concurrently)

    @classmethod
    def build(
        cls, results: Iterable[CheckResult], *, strict: bool = False, elapsed_s: float = 0.0
    ) -> DoctorReport:
        return cls(
            results=tuple(results), host=socket.gethostname(), strict=strict, elapsed_s=elapsed_s
        )

    @property
    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in (Status.PASS, Status.WARN, Status.FAIL, Status.SKIP)}
        counts[Status.ERROR.value] = 0
        for result in self.results:
            counts[result.status.value] += 1
        return counts

    @property
    def exit_code(self) -> ExitCode:
        """1 when a check failed or could not run (or, with --strict, warned); else 0."""
        statuses = {r.status for r in self.results}
        if statuses & {Status.FAIL, Status.ERROR}:
            return ExitCode.PROBLEMS
        if self.strict and Status.WARN in statuses:
            return ExitCode.PROBLEMS
        return ExitCode.OK

    def by_id(self, check_id: str) -> CheckResult:
        for result in self.results:
            if result.id == check_id:
                return result
        raise KeyError(check_id)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "ddpdoctor_version": self.version,
            "host": self.host,
            "exit_code": int(self.exit_code),
            "counts": self.counts,
            "elapsed_s": round(self.elapsed_s, 3),
            "results": [r.to_json() for r in self.results],
        }
