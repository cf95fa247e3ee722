"""A full run directory never fails the job: on a 2 MiB file system a job that prints 2.4 MB
finishes with exit 0 under ddpdoctor as it does without it, every line it printed reaches the
console, and the verdict says the run directory filled up. A third job fills the disk with its
events before it ends, so that its ranks' exit events are dropped: it is healthy, as torchrun's
exit status says, not a crash of ranks that "vanished". The three jobs run at once."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.procs import PYTHON, Finished, ddpdoctor_cmd, run

pytestmark = pytest.mark.integration

MODES = ("script", "command", "events")
LINES = 6000  # x 2 ranks x ~200 bytes: more than the file system holds

PRINTER = textwrap.dedent(
    f"""
    import os
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for i in range({LINES}):
        print(f"rank {{rank}} line {{i}} " + "x" * 180)
    dist.barrier()
    print(f"rank {{rank}} DONE")
    dist.destroy_process_group()
    """
)


# Mode "events": a job whose events fill the disk before it ends, so that its ranks' exit events
# are dropped: their ends come from what ddpdoctor saw (the processes gone, torchrun's exit 0).
FILLER = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    for i in range(6000):
        dist.all_reduce(t)
        if i % 3 == 0:
            print(f"rank {rank} step {i} " + "x" * 100)
    dist.barrier()
    print(f"rank {rank} DONE")
    dist.destroy_process_group()
    """
)


def _mount_small_fs(mount: Path) -> None:
    """A real 2 MiB tmpfs at `mount` (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True,
        timeout=30,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace')}")


def _job(mode: str, work: Path) -> Finished:
    """script: ddpdoctor's torchrun writes each rank's output to its own log file; command: the
    user's torchrun, whose ranks write to torchrun.log."""
    script = work / "printer.py"
    script.write_text(FILLER if mode == "events" else PRINTER)
    job = ["--nproc", "2", "--", str(script)]
    if mode == "command":
        job = ["--", PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)]
    cmd = ddpdoctor_cmd(
        "run", "--no-tui", "--no-doctor", "--run-dir", str(work / "small" / "run"), *job
    )  # fmt: skip
    return run(cmd, timeout=240)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both jobs, each on its own small file system, at once; the file systems unmounted after."""
    mounts = []
    try:
        works = {}
        for mode in MODES:
            work = tmp_path_factory.mktemp(f"full-disk-{mode}")
            _mount_small_fs(work / "small")
            mounts.append(work / "small")
            works[mode] = work
        with ThreadPoolExecutor(max_workers=len(MODES)) as pool:
            ended = {mode: pool.submit(_job, mode, work) for mode, work in works.items()}
            yield {mode: future.result() for mode, future in ended.items()}
    finally:
        for mount in mounts:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


@pytest.mark.parametrize("mode", MODES[:2])
def test_a_full_run_directory_does_not_fail_the_job(runs, mode):
    done = runs[mode]
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} DONE" in out
        seen = {int(n) for n in re.findall(rf"rank {rank} line (\d+) x", out)}
        missing = sorted(set(range(LINES)) - seen)
        assert not missing, (rank, len(missing), missing[:20])
    assert "run.disk_full: run directory full" in out
    assert "events after step" in out


def test_ranks_whose_exit_events_the_disk_dropped_ended_as_torchrun_says(runs):
    """Before: "CRASH: culprit rank 1", both ranks "died without an exit event", exit 1."""
    done = runs["events"]
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "rank 0 DONE" in out and "rank 1 DONE" in out
    assert "HEALTHY: all 2 ranks finished" in out and "CRASH" not in out
    assert "died without an exit event" not in out
    assert "run.disk_full: run directory full" in out and "launcher's exit status" in out
