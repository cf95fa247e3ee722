"""A rank is who ddpdoctor saw, end to end: while a healthy job trains under `ddpdoctor run`,
records no process of the job wrote are dropped into its run directory — `events/rank-7.jsonl`
(a hello claiming a world of 8 and a pid that does not exist, then an error and an exit code 1)
and `events/rank-5.jsonl` (an error without a hello). Before, the first made ddpdoctor print
"CRASH: culprit rank 7" and stop the job within seconds. Now the job trains to its end: healthy,
exit 0, one warning."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.procs import PYTHON, REPO, ddpdoctor_cmd, run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NO_SUCH_PID = 4_190_001


def _forge(run_dir: Path, stop: threading.Event) -> None:
    """Once rank 0 has trained a few steps, write the two files."""
    events = run_dir / "events"
    while not stop.is_set():
        text = (events / "rank-0.jsonl").read_text() if (events / "rank-0.jsonl").exists() else ""
        if text.count('"kind":"step"') >= 3:
            break
        time.sleep(0.2)
    now = time.time()
    lines = {
        7: [{"kind": "hello", "world_size": 8, "local_rank": 0, "host": socket.gethostname(), "pid": NO_SUCH_PID},
            {"kind": "error", "type": "RuntimeError", "message": "forged"},
            {"kind": "exit", "code": 1}],
        5: [{"kind": "error", "type": "RuntimeError", "message": "forged"}],
    }  # fmt: skip
    for rank, evs in lines.items():
        with open(events / f"rank-{rank}.jsonl", "a") as fh:
            for ev in evs:
                fh.write(json.dumps({"v": 1, "t": now, "mono": 0.0, "rank": rank, **ev}) + "\n")


@pytest.fixture(scope="module")
def forged(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("forged") / "run"
    stop = threading.Event()
    forger = threading.Thread(target=_forge, args=(run_dir, stop))
    forger.start()
    try:
        cmd = ddpdoctor_cmd(
            "run", "--no-tui", "--no-doctor", "--json", "--run-dir", str(run_dir), "--",
            PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            str(REPO / "sample_jobs" / "healthy.py"),
        )  # fmt: skip
        done = run(cmd, timeout=240)
    finally:
        stop.set()
        forger.join(10)
    return done, run_dir


def test_forged_ranks_neither_stop_nor_fail_a_healthy_job(forged):
    done, run_dir = forged
    assert (run_dir / "events" / "rank-7.jsonl").exists(), "the forger never wrote"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["verdict"] == "healthy" and doc["culprits"] == []
    assert doc["job"]["stopped_for"] is None
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    (warning,) = [f for f in doc["findings"] if f["id"] == "run.unvouched"]
    assert warning["severity"] == "warning"
    assert f"pid {NO_SUCH_PID} is no process" in warning["summary"]
    assert "rank 5: its events have no hello" in warning["summary"]
