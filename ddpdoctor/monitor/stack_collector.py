"""py-spy stacks for the monitor: captured in the background, grouped, folded into snapshots.

A capture runs ddpdoctor.monitor.stacks.capture_stacks on every local rank (bounded in time) in a
daemon thread; the poller picks up the grouped result on a later poll, so a poll never waits for
py-spy. Ranks on other hosts cannot be captured from here. A post-mortem shows the latest capture
stored in RUN_DIR/stacks/.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from ddpdoctor.findings import Finding
from ddpdoctor.monitor.background import BackgroundTask
from ddpdoctor.monitor.snapshot import StackGroup
from ddpdoctor.rundir import RunDir


class StackCollector:
    def __init__(self, run: RunDir, *, timeout_s: float = 10.0) -> None:
        self.run = run
        self.timeout_s = timeout_s
        self.groups: tuple[StackGroup, ...] = ()
        self.findings: tuple[Finding, ...] = ()
        self.status: str | None = None
        self.captures = 0
        self._task: BackgroundTask | None = None

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done

    def start(self, targets: Mapping[int, int], *, remote: int = 0) -> bool:
        """Capture the stacks of `targets` (rank -> pid) now, in the background."""
        if self.busy:
            return False
        if not targets:
            self.status = (
                f"no local rank to capture ({remote} on other hosts)"
                if remote
                else "no rank alive to capture"
            )
            return False
        ranks = sorted(targets)
        self.status = f"capturing stacks of {len(ranks)} rank{'s' if len(ranks) != 1 else ''}…"
        run, timeout = self.run, self.timeout_s
        wanted = dict(targets)

        def work():
            from ddpdoctor.monitor.stacks import capture_stacks, group_stacks

            capture = capture_stacks(run, wanted, timeout_s=timeout)
            return capture, group_stacks(capture)

        self._task = BackgroundTask("stacks", work)
        return True

    def collect(self) -> bool:
        """Fold a finished capture in; True when something changed."""
        task = self._task
        if task is None or not task.done:
            return False
        self._task = None
        if task.error is not None:
            self.status = f"stack capture failed: {type(task.error).__name__}: {task.error}"
            return True
        capture, groups = task.result
        self._fold(capture, groups)
        self.captures += 1
        return True

    def wait(self, timeout: float) -> bool:
        task = self._task
        if task is None:
            return True
        finished = task.wait(timeout)
        self.collect()
        return finished

    def load_latest(self) -> bool:
        """The latest capture stored in the run directory (post-mortem); False when none."""
        folder = self.run.stacks_dir
        try:
            captures = sorted(
                (p for p in folder.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime
            )
        except OSError:
            return False
        for path in reversed(captures):
            try:
                from ddpdoctor.monitor.stacks import group_stacks, load_capture

                capture = load_capture(path)
                self._fold(capture, group_stacks(capture), stored=path.name)
                return True
            except Exception:  # noqa: BLE001 - a damaged capture: try the one before
                continue
        return False

    def _fold(self, capture, groups, *, stored: str | None = None) -> None:
        self.groups = tuple(groups)
        findings = list(getattr(capture, "findings", ()) or ())
        single = getattr(capture, "finding", None)
        if single is not None:
            findings.append(single)
        self.findings = tuple(f for f in findings if isinstance(f, Finding))
        ranks = sorted({r for g in self.groups for r in g.ranks})
        errors = getattr(capture, "errors", None) or {}
        when = time.strftime("%H:%M:%S")
        if stored:
            self.status = f"stacks from capture {stored}"
        elif ranks:
            self.status = f"captured {len(ranks)} rank{'s' if len(ranks) != 1 else ''} at {when}"
        elif self.findings:
            self.status = self.findings[0].summary
        else:
            self.status = f"no stacks captured at {when}"
        if errors and not stored:
            self.status += f" ({len(errors)} failed)"
