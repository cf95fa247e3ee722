"""A spinner on a terminal's stderr naming the slow checks still running (nothing elsewhere)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from ddpdoctor.checks.model import CheckResult
from ddpdoctor.checks.registry import Check
from ddpdoctor.checks.runner import ProgressCallback
from ddpdoctor.console import make_console


@contextlib.contextmanager
def progress_spinner(enabled: bool = True) -> Iterator[ProgressCallback | None]:
    """The `on_progress` callback for run_checks: a spinner while the checks run, or None when
    disabled or stderr is not a terminal (CI logs stay free of control codes)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    console = make_console(sys.stderr)
    running: dict[str, Check] = {}
    with console.status("checking...", spinner="dots") as status:

        def progress(what: str, check: Check, _result: CheckResult | None) -> None:
            if what == "start":
                running[check.id] = check
            else:
                running.pop(check.id, None)
            slow = [c.title for c in running.values() if c.slow] or [
                c.title for c in running.values()
            ]
            status.update(f"checking: {', '.join(slow[:3])}" if slow else "checking...")

        yield progress
