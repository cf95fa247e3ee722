"""Busy is not stuck: real torchrun jobs (gloo) whose ranks wait for a busy rank 0 finish as
they would under plain torchrun, while a rank blocked in a sleep is still a hang, named and
stopped.

`--hang-after 4` puts the hang threshold well below each job's wait, so the jobs stay short
while the waits are long enough to have been called a hang (and stopped) before the progress
model: what decides now is whether rank 0 is busy or blocked.

The four jobs run at once, in one module fixture: most of each job is a wait, and a busy rank 0
is still judged busy on a loaded machine (its run-queue wait counts as work).
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.procs import REPO, clean_env, ddpdoctor_cmd, kill_group

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

# The bound of a job that never ends: each ends in 20-40 s quiet; four at once beside the other
# worker's jobs at a load of 12-22, one had not ended after 90 s.
RUN_TIMEOUT_S = 180

BUSY_BEFORE_BARRIER = """
import datetime, time
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
if dist.get_rank() == 0:  # "rank 0 downloads and unpacks, the others wait"
    end = time.time() + 9
    while time.time() < end:
        sum(i * i for i in range(2000))
dist.barrier()
print("rank", dist.get_rank(), "past the barrier", flush=True)
dist.destroy_process_group()
"""

BUSY_EVAL_BETWEEN_EPOCHS = """
import time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def evaluate(module):
    end = time.time() + 8  # rank 0 alone, while rank 1 waits in the next all-reduce
    with torch.no_grad():
        while time.time() < end:
            module(torch.randn(256, 32)).sum().item()


for epoch in range(2):
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(8, 32)).sum().backward()
        opt.step()
    if rank == 0 and epoch == 0:
        evaluate(model.module)
print("rank", rank, "trained", flush=True)
dist.destroy_process_group()
"""

BLOCKED_BEFORE_BARRIER = """
import time
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    time.sleep(120)  # blocked: no CPU, no I/O, the same line at every heartbeat
dist.barrier()
dist.destroy_process_group()
"""


def run_job(tmp_path: Path, source: str, *options: str) -> tuple[int, str, list[dict], float]:
    """Run `source` under `ddpdoctor run`; returns (exit code, output, every diagnosis.json seen
    while it ran, seconds)."""
    script = tmp_path / "job.py"
    script.write_text(source)
    run_dir = tmp_path / "run"
    cmd = ddpdoctor_cmd(
        "run",
        "--no-tui",
        "--no-doctor",
        "--nproc",
        "2",
        "--hang-after",
        "4",
        "--run-dir",
        str(run_dir),
        *options,
        "--",
        str(script),
    )
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen: list[dict] = []
    try:
        while proc.poll() is None:
            assert time.monotonic() - start < RUN_TIMEOUT_S, "the job did not end"
            try:
                seen.append(json.loads((run_dir / "diagnosis.json").read_text()))
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        out = proc.stdout.read() if proc.stdout else ""
    finally:
        kill_group(proc)
    seen.append(json.loads((run_dir / "diagnosis.json").read_text()))
    return proc.returncode, out, seen, time.monotonic() - start


def findings(seen: list[dict], finding_id: str) -> list[dict]:
    return [f for d in seen for f in d["findings"] if f["id"] == finding_id]


JOBS = {
    "busy-before-barrier": (BUSY_BEFORE_BARRIER, ()),
    "busy-eval-flight-recorder": (BUSY_EVAL_BETWEEN_EPOCHS, ()),
    "busy-eval-ddp-buckets": (BUSY_EVAL_BETWEEN_EPOCHS, ("--ddp-buckets",)),
    "blocked-in-sleep": (BLOCKED_BEFORE_BARRIER, ()),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[int, str, list[dict], float]]:
    """Every job of this module, run at once: name -> run_job's result."""
    base = tmp_path_factory.mktemp("busy-ranks")

    def one(name: str):
        work = base / name
        work.mkdir()
        source, options = JOBS[name]
        return run_job(work, source, *options)

    with ThreadPoolExecutor(max_workers=len(JOBS)) as pool:
        ended = {name: pool.submit(one, name) for name in JOBS}
        return {name: future.result() for name, future in ended.items()}


def test_rank0_busy_before_a_barrier_is_a_wait_and_the_job_finishes(runs):
    code, out, seen, _ = runs["busy-before-barrier"]
    final = seen[-1]
    assert code == 0, out
    assert final["verdict"] == "healthy" and not final["culprits"]
    assert [f["id"] for f in final["findings"] if f["severity"] != "info"] == []
    assert "stopped the job" not in out and "HANG" not in out
    assert "rank 1 past the barrier" in out
    live = findings(seen, "wait.busy_rank")
    assert live, "no wait finding while rank 0 was busy"
    assert live[-1]["ranks"] == [0] and live[-1]["severity"] == "info"
    assert (
        "rank 1 waits" in live[-1]["summary"]
        and "for rank 0, busy in job.py:" in live[-1]["summary"]
    )
    assert "in barrier #1" in live[-1]["summary"]
    waits = [w for d in seen for w in d["waits"] if w["busy"]]
    assert waits and waits[-1]["activity"]["state"] == "busy" and waits[-1]["waiters"] == [1]
    assert waits[-1]["activity"]["cpu_pct"] > 0  # a share of a core on a loaded machine
    # the timeout the script gave init_process_group, counted down
    assert final["thresholds"]["pg_timeout_s"] == 300.0
    assert final["thresholds"]["pg_timeout_basis"] == "init_process_group(timeout=...)"
    assert 0 < waits[-1]["timeout_in_s"] < 300


@pytest.mark.parametrize("buckets", [False, True], ids=["flight-recorder", "ddp-buckets"])
def test_rank0_busy_evaluating_between_epochs_is_healthy(runs, buckets):
    code, out, seen, _ = runs["busy-eval-ddp-buckets" if buckets else "busy-eval-flight-recorder"]
    final = seen[-1]
    assert code == 0, out
    assert final["verdict"] == "healthy" and "stopped the job" not in out
    # no alarm of any kind: the one long step of rank 0 is no straggler either
    assert [f["id"] for f in final["findings"] if f["severity"] != "info"] == []
    assert "rank 0 trained" in out and "rank 1 trained" in out
    # rank 1's wait in the all-reduce is shown live, with where rank 0 is busy: from the
    # bucket events with --ddp-buckets, from the flight recorder's dumps by default (DDP's
    # all-reduce runs in C++ with no event per bucket)
    waits = [w for d in seen for w in d["waits"] if w["busy"]]
    assert waits, "the wait of rank 1 for rank 0 was not seen"
    assert waits[-1]["on"] == [0] and waits[-1]["collective"]["op"] == "all_reduce"
    assert "evaluate" in (waits[-1]["activity"]["where"] or "")
    assert final["thresholds"]["pg_timeout_s"] == 1800.0  # gloo's default


def test_rank0_blocked_in_sleep_is_a_hang_named_and_stopped(runs):
    code, out, seen, elapsed = runs["blocked-in-sleep"]
    final = seen[-1]
    assert code == 1, out
    assert final["verdict"] == "hang" and final["culprits"] == [0] and final["confirmed"]
    assert "ddpdoctor stopped the job after diagnosing a hang" in out
    hang = next(f for f in final["findings"] if f["id"] == "hang")
    assert hang["summary"].startswith("rank 0 never reached barrier #1")
    live = [f for d in seen for f in d["findings"] if f["id"] == "hang"]
    assert any("blocked in job.py:7 <module>" in f["summary"] for f in live), live[:1]
    # right after init its frame still moved (busy, info) until two quiet heartbeats showed it
    # blocked: never more than that
    assert all(f["severity"] == "info" for f in findings(seen, "wait.busy_rank"))
    assert elapsed < 100  # stopped long before the sleep ends
