"""`ddpdoctor watch RUN_DIR`: attach to a run directory (live or finished) and diagnose it.

The TUI on a terminal; otherwise (or with --no-tui) live text until the job finishes or Ctrl-C,
which leaves the job alone. `--json` prints the diagnosis.json document once. Exit codes: 0 healthy
or still running (or interrupted by its user), 1 hang / mismatch / crash / not started, 2 not a
run directory. A finished run's diagnosis.json, written by its launcher, is never overwritten.
"""

from __future__ import annotations

import argparse
import sys
import time

from ddpdoctor.console import make_console, tui_capable
from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.model.snapshot import Snapshot
from ddpdoctor.monitor.pipeline.gc_pacing import pace_for_watching
from ddpdoctor.monitor.tell.headless import HeadlessView
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.rundir import RunDir

POLL_S = 0.5


def exit_code_for(snap: Snapshot) -> int:
    return int(ExitCode.PROBLEMS if snap.verdict.is_problem else ExitCode.OK)


def main(args: argparse.Namespace) -> int:
    run = RunDir.open(args.run_dir)  # not a run directory: UsageError, exit 2
    pace_for_watching()
    if args.json:
        snap = Monitor(run, hang_after=args.hang_after, capture_stacks=False).close()
        sys.stdout.write(jsontext.dumps(snap.diagnosis_json(), indent=2) + "\n")
        return exit_code_for(snap)
    monitor = Monitor(run, hang_after=args.hang_after)
    if not args.no_tui and tui_capable():
        run_tui = _tui()
        if run_tui is not None:
            run_tui(monitor, mode="watch")
            return exit_code_for(monitor.close())  # quitting leaves the job alone
    return watch_headless(monitor, make_console(sys.stdout), live=sys.stdout.isatty())


def _tui():
    try:
        from ddpdoctor.tui import run_tui
    except ImportError:
        return None
    return run_tui


def watch_headless(monitor: Monitor, console, *, live: bool, poll_s: float = POLL_S) -> int:
    """Text until every rank has finished (or the record has ended), or until Ctrl-C."""
    view = HeadlessView(console, live=live)
    console.print(
        f"watching {monitor.run.path} (Ctrl-C stops watching; the job goes on)",
        markup=False,
        soft_wrap=True,
    )
    snap = monitor.poll()
    try:
        while True:
            view.update(snap)
            if snap.finished:
                break
            time.sleep(poll_s)
            snap = monitor.poll()
    except KeyboardInterrupt:
        pass  # stop watching; the job is not ours to stop
    snap = monitor.close()
    view.close(snap)
    if monitor.write_error:
        console.print(f"note: {monitor.write_error}", markup=False, soft_wrap=True)
    elif not monitor.writes_diagnosis:
        console.print(
            f"{monitor.run.diagnosis_json} is the launcher's final diagnosis: left as it is",
            markup=False,
            soft_wrap=True,
        )
    else:
        console.print(
            f"diagnosis written to {monitor.run.diagnosis_json}", markup=False, soft_wrap=True
        )
    return exit_code_for(snap)
