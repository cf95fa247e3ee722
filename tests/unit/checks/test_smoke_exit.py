"""An interrupted doctor ends every smoke rank it started, even one forked a moment before."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from ddpdoctor.checks.probes import smoke as smoke_probe
from ddpdoctor.checks.probes.smoke_model import SmokeRequest


@pytest.mark.timeout(60)
def test_a_rank_forked_as_the_doctor_exits_is_ended_with_it(tmp_path, monkeypatch):
    rank_script = tmp_path / "rank.py"
    rank_script.write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setattr(smoke_probe, "WORKER", rank_script)
    monkeypatch.setattr(smoke_probe, "_exiting", False, raising=False)
    forked = threading.Event()
    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def popen_then_pause(*args, **kwargs):
        # The rank runs, but the thread that started it has not yet recorded it: the moment a
        # Ctrl-C on a loaded machine once fell into.
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        forked.set()
        time.sleep(0.5)
        return proc

    supervisor = smoke_probe._Supervisor(SmokeRequest(nproc=1, backend="gloo", env={}))
    monkeypatch.setattr(smoke_probe.subprocess, "Popen", popen_then_pause)
    spawner = threading.Thread(target=supervisor._spawn, daemon=True)
    spawner.start()
    try:
        assert forked.wait(timeout=30)
        smoke_probe._kill_leftovers()  # what the doctor's exit runs
        assert started[0].poll() is not None, "a rank the doctor started outlived it"
        spawner.join(timeout=10)
        late = smoke_probe._Supervisor(SmokeRequest(nproc=2, backend="gloo", env={}))
        with pytest.raises(smoke_probe.DoctorExiting):  # no report, so no verdict of a test
            late.run()  # that never ran (an empty or partial one would read as pass or death)
        assert late.ranks == [] and len(started) == 1, "a rank started after the doctor's exit"
    finally:
        monkeypatch.undo()
        for proc in started:
            proc.kill()
            proc.wait(timeout=10)
        for rank in supervisor.ranks:
            rank.reader.close()
            rank.stderr.close()
        supervisor.selector.close()
