"""Whether the run directory's file system has filled up, and from which step on.

ddpdoctor's writes into the run directory degrade on a full disk instead of failing the job
(events are dropped by the ranks' writers, a rank's output goes to the console only,
ddpdoctor.runtime.output_guard), so what it recorded after that point is incomplete: the verdict
has to say so. Checked with one statvfs every few seconds.
"""

from __future__ import annotations

import os

from ddpdoctor.findings import Finding, Severity

FULL_BELOW_BYTES = 1 << 20  # less free space than this for unprivileged writers: full
CHECK_EVERY_S = 2.0
FINDING_ID = "run.disk_full"


class DiskWatch:
    def __init__(self, path: str | os.PathLike[str], *, every_s: float = CHECK_EVERY_S) -> None:
        self.path = path
        self.every_s = every_s
        self.full_after_step: int | None = None  # the latest step seen when it was first full
        self.full_seen = False
        self.free_bytes: int | None = None
        self.read_only = False
        self._checked: float | None = None

    def check(self, now: float, step: int | None, *, force: bool = False) -> None:
        if not force and self._checked is not None and now - self._checked < self.every_s:
            return
        self._checked = now
        try:
            st = os.statvfs(self.path)
        except OSError:
            return
        self.free_bytes = st.f_bavail * st.f_frsize
        self.read_only = bool(st.f_flag & os.ST_RDONLY)
        if (self.free_bytes < FULL_BELOW_BYTES or self.read_only) and not self.full_seen:
            self.full_seen = True
            self.full_after_step = step

    @property
    def events_lost(self) -> str | None:
        """Why the ranks' events may be missing from now on (None: nothing says so)."""
        if not self.full_seen:
            return None
        return "read-only" if self.read_only else "full"

    def findings(self) -> list[Finding]:
        if not self.full_seen:
            return []
        after = (
            f"after step {self.full_after_step}"
            if self.full_after_step is not None
            else "from the start"
        )
        what = (
            "run directory read-only"
            if self.read_only
            else f"run directory full ({self.free_bytes or 0} bytes free on its file system)"
        )
        return [
            Finding(
                FINDING_ID,
                Severity.WARNING,
                f"{what}: events {after} dropped, rank output from then on shown on the console but not "
                "kept in the rank logs; the ranks' ends are from what ddpdoctor saw of their "
                "processes and their launcher's exit status",
                "Free space on the run directory's file system, or put runs on a larger one "
                "(--run-dir DIR). The job itself was not stopped by it.",
            )
        ]
