"""Real py-spy captures: a blocked Python process, a 2-rank gloo job, and a real ptrace refusal."""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

from ddpdoctor.stacks.capture import (
    PtraceFacts,
    capture_stacks,
    find_pyspy,
    group_stacks,
    run_command,
)
from ddpdoctor.stacks.groups import innermost_frame
from tests.procs import PYTHON, background, clean_env, free_port, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(find_pyspy() is None, reason="py-spy is not installed"),
]

BLOCKED = """
import sys, threading
def wait_for_godot(event):
    open(sys.argv[1], "w").write("ready")
    event.wait()
wait_for_godot(threading.Event())
"""

# Rank 0 blocks in a barrier that rank 1 never enters: rank 1 sleeps in a Python loop.
RANK_JOB = """
import os, sys, time
import torch.distributed as dist

def sleep_in_python_loop():
    while True:
        time.sleep(0.05)

dist.init_process_group("gloo")
with open(sys.argv[1], "a") as out:
    out.write(f"{dist.get_rank()} {os.getpid()}\\n")
if dist.get_rank() == 0:
    dist.barrier()
else:
    sleep_in_python_loop()
"""


@pytest.fixture(scope="module")
def blocked_pid(tmp_path_factory):
    folder = tmp_path_factory.mktemp("blocked")
    (folder / "blocked.py").write_text(BLOCKED)
    ready = folder / "ready"
    with background([PYTHON, str(folder / "blocked.py"), str(ready)]) as proc:
        wait_for(ready.exists, timeout=30, what="the blocked process")
        yield proc.pid


@pytest.fixture(scope="module")
def gloo_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pair")
    (folder / "rank_job.py").write_text(RANK_JOB)
    ready = folder / "ready.txt"
    port = str(free_port())
    with contextlib.ExitStack() as stack:
        for rank in (0, 1):
            env = clean_env(
                {
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": port,
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": "2",
                }
            )
            stack.enter_context(
                background([PYTHON, str(folder / "rank_job.py"), str(ready)], env=env)
            )

        def both_ready():
            lines = ready.read_text().splitlines() if ready.exists() else []
            return (
                {int(r): int(p) for r, p in (line.split() for line in lines)}
                if len(lines) == 2
                else None
            )

        yield wait_for(both_ready, timeout=120, what="both ranks to start")


@pytest.mark.timeout(60)
def test_a_blocked_process_shows_where_it_waits(tmp_path, blocked_pid):
    capture = capture_stacks(tmp_path / "run", {0: blocked_pid}, timeout_s=20)
    assert capture.errors == {} and capture.findings == ()
    (group,) = group_stacks(capture)
    assert group.ranks == (0,) and group.thread == "MainThread"
    assert innermost_frame(group.frames) == "blocked.py:5 wait_for_godot"
    assert group.frames[-1].startswith("… ")  # threading's wait and the native frames, folded
    assert (tmp_path / "run" / "stacks" / capture.capture_id / "rank-0.json").is_file()


@pytest.mark.timeout(150)
def test_a_gloo_rank_in_barrier_and_a_sleeping_rank_are_different_classes(tmp_path, gloo_pair):
    def split_as_expected():
        capture = capture_stacks(tmp_path / "run", gloo_pair, timeout_s=20)
        groups = {g.ranks: g for g in group_stacks(capture)}
        if set(groups) != {(0,), (1,)}:
            return None
        barrier = any(
            "distributed_c10d.py:" in f and f.endswith(" barrier") for f in groups[(0,)].frames
        )
        return capture if barrier else None  # rank 0 may not have reached the barrier yet

    capture = wait_for(split_as_expected, timeout=60, interval=0.5, what="rank 0 in barrier")
    groups = group_stacks(capture)
    rank1 = next(g for g in groups if g.ranks == (1,))
    assert innermost_frame(rank1.frames) == "rank_job.py:7 sleep_in_python_loop"
    assert all(r.elapsed_s is not None and r.elapsed_s <= 20 for r in capture.ranks)


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root")
def test_py_spy_without_ptrace_permission_gives_the_finding(tmp_path, blocked_pid):
    """py-spy run as `nobody` against a root process: the kernel really refuses."""

    def as_nobody(cmd, timeout):
        unprivileged = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
        return run_command(unprivileged, timeout)

    facts = PtraceFacts(yama_scope=None, cap_sys_ptrace=False, euid=65534)
    capture = capture_stacks(
        tmp_path / "run", {3: blocked_pid}, runner=as_nobody, ptrace=facts, timeout_s=20
    )
    (finding,) = capture.findings
    assert finding.id == "stacks.ptrace_denied" and finding.ranks == (3,)
    assert "Permission Denied" in finding.summary and "--cap-add SYS_PTRACE" in finding.fix
    assert capture.ranks[0].denied and group_stacks(capture) == ()
