"""`ddpdoctor run`: launch the reference DDP job, or a script of yours, under torchrun and watch it.

Everything is checked before anything starts (bad input: one error line, exit 2); see
ddpdoctor/launch/launcher.py for the run itself and its exit codes. This command only wires the
layers: the plan from the flags, and the monitor, the text view and the TUI that watch the job.
"""

from __future__ import annotations

import argparse
from functools import partial

from ddpdoctor.launch.launcher import Watchers, launch
from ddpdoctor.launch.plan import plan_from_args
from ddpdoctor.monitor.pipeline.gc_pacing import pace_for_watching
from ddpdoctor.monitor.pipeline.live import Monitor
from ddpdoctor.monitor.tell.headless import HeadlessView


def main(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    pace_for_watching()
    return launch(plan, watchers())


def watchers() -> Watchers:
    def run_tui(*args, **kwargs):
        from ddpdoctor.tui import run_tui as run  # Textual loads only when a terminal shows it

        return run(*args, **kwargs)

    # the launcher's monitor: it looks at its ranks' network (not a watcher's, from elsewhere)
    return Watchers(monitor=partial(Monitor, launcher=True), headless=HeadlessView, tui=run_tui)
