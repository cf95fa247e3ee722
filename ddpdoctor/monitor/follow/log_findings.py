"""The log explainers' findings for a run, refreshed in the background as logs grow.

ddpdoctor.explain reads every log of the run directory and combines them across files
(several ranks' watchdog lines say which rank is behind), so it runs on the whole directory: in
a daemon thread while the job runs, when new warning or error lines arrived and not more often
than every few seconds, and once more, synchronously, at the end.
"""

from __future__ import annotations

from ddpdoctor.background import BackgroundTask
from ddpdoctor.findings import Finding
from ddpdoctor.protocol.rundir import RunDir

# The explainers already report these better from the events; their log-only version would
# repeat the same error (a Python traceback the events carry, torchrun's victim-first table).
_COVERED_BY_EVENTS: frozenset[str] = frozenset()


class LogFindings:
    def __init__(self, run: RunDir, *, every_s: float = 3.0) -> None:
        self.run = run
        self.every_s = every_s
        self.findings: tuple[Finding, ...] = ()
        self.error: str | None = None
        self._task: BackgroundTask | None = None
        self._last_start: float | None = None
        self._dirty = False

    def note_lines(self, interesting: bool) -> None:
        """New log lines arrived; `interesting`: some were warnings or errors."""
        if interesting:
            self._dirty = True

    def maybe_start(self, now: float) -> None:
        if not self._dirty or (self._task is not None and not self._task.done):
            return
        if self._last_start is not None and now - self._last_start < self.every_s:
            return
        self._dirty = False
        self._last_start = now
        run = self.run
        self._task = BackgroundTask("explain", lambda: _explain(run))

    def collect(self) -> bool:
        task = self._task
        if task is None or not task.done:
            return False
        self._task = None
        if task.error is not None:
            self.error = f"{type(task.error).__name__}: {task.error}"
            return False
        self.findings = tuple(task.result)
        return True

    def refresh_now(self, timeout: float = 30.0) -> None:
        """The final pass: wait for a running one, then explain everything once more."""
        if self._task is not None:
            self._task.wait(timeout)
            self.collect()
        task = BackgroundTask("explain", lambda: _explain(self.run))
        if task.wait(timeout) and task.error is None:
            self.findings = tuple(task.result)
        elif task.error is not None:
            self.error = f"{type(task.error).__name__}: {task.error}"


def _explain(run: RunDir) -> list[Finding]:
    if not run.logs_dir.is_dir() and not run.nccl_dir.is_dir():
        return []
    from ddpdoctor.explain import explain_files

    found = explain_files([run.path])
    return [f for f in found if f.id not in _COVERED_BY_EVENTS]
