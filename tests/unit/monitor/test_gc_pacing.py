"""A watcher's process collects garbage at its own pace; a user's process that imports the
library keeps its own."""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys

from ddpdoctor.commands import watch
from ddpdoctor.monitor.pipeline.gc_pacing import WATCHER_THRESHOLDS, pace_for_watching
from ddpdoctor.protocol.rundir import RunDir


def test_pacing_sets_the_watchers_thresholds():
    before = gc.get_threshold()
    try:
        pace_for_watching()
        assert gc.get_threshold() == WATCHER_THRESHOLDS
        assert WATCHER_THRESHOLDS[0] > before[0]  # young objects collected less often
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
