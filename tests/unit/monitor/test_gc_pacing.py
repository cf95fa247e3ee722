"""A watcher's process collects garbage at its own pace; a user's process that imports the
library keeps its own."""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys

from ddpdoctor.commands import watch
from ddpdoctor.monitor.pipeline import gc_pacing
from ddpdoctor.monitor.pipeline.gc_pacing import (
    WATCHER_THRESHOLDS,
    YOUNG_MAX,
    fit_to_ranks,
    pace_for_watching,
    thresholds_for,
)
from ddpdoctor.protocol.rundir import RunDir


def test_pacing_sets_the_watchers_thresholds(monkeypatch):
    before = gc.get_threshold()
    monkeypatch.setattr(gc_pacing, "_watching", False)
    try:
        pace_for_watching()
        assert gc.get_threshold() == WATCHER_THRESHOLDS
        assert WATCHER_THRESHOLDS[0] > before[0]  # young objects collected less often
    finally:
        gc.set_threshold(*before)


def test_a_watcher_of_many_ranks_collects_young_objects_less_often(monkeypatch):
    assert thresholds_for(1) == thresholds_for(16) == WATCHER_THRESHOLDS
    assert thresholds_for(8192) == (409_600, *WATCHER_THRESHOLDS[1:])
    assert thresholds_for(32_768)[0] == thresholds_for(10**6)[0] == YOUNG_MAX  # bounded
    before = gc.get_threshold()
    monkeypatch.setattr(gc_pacing, "_watching", False)
    try:
        fit_to_ranks(8192)  # not a watcher's process: its collector is the user's
        assert gc.get_threshold() == before
        pace_for_watching()
        fit_to_ranks(8192)
        assert gc.get_threshold() == thresholds_for(8192)
        fit_to_ranks(8)  # the world shrank (an elastic job): back to the watcher's pace
        assert gc.get_threshold() == WATCHER_THRESHOLDS
    finally:
        gc.set_threshold(*before)


def test_watch_paces_its_process(tmp_path, monkeypatch, capsys):
    paced = []
    monkeypatch.setattr(watch, "pace_for_watching", lambda: paced.append(True))
    run = RunDir.create(tmp_path / "run")
    args = argparse.Namespace(run_dir=str(run.path), json=True, hang_after=None, no_tui=True)
    watch.main(args)
    assert paced == [True]
    assert '"verdict"' in capsys.readouterr().out


def test_importing_the_library_leaves_the_collector_alone():
    code = (
        "import gc; before = gc.get_threshold(); "
        "import ddpdoctor.monitor, ddpdoctor.launch.launcher, ddpdoctor.commands.run; "
        "print(gc.get_threshold() == before)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "True"
