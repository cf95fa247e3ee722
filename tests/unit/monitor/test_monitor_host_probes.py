"""Host facts of the ranks others wait on: children's CPU (real processes) and GPU utilization
(recorded values through the probe interface)."""

from __future__ import annotations

import os
import sys
import time

from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.follow.host_probes import CpuLooks, NvmlProbe, RecordedGpuProbe
from ddpdoctor.monitor.follow.liveness import this_host
from ddpdoctor.monitor.model.progress import BUSY_CPU
from ddpdoctor.monitor.model.snapshot import Verdict
from ddpdoctor.protocol.verdicts import ActivityState
from tests.procs import background
from tests.unit.monitor.test_monitor_monitor import Clock, Writer, new_run, run_env

# (says when it is past its start-up: its imports take CPU, for seconds on a loaded machine)
SLEEPER = [sys.executable, "-c", "import time; print('asleep', flush=True); time.sleep(60)"]
SPINNER = [
    sys.executable,
    "-c",
    "import time\nend = time.time() + 30\nwhile time.time() < end: pass",
]


def _asleep(proc) -> int:
    """The sleeper's pid once it sleeps: a rank whose CPU time no longer moves (the watcher's
    own look at its CPU would otherwise see the start-up's and call it busy, under load)."""
    assert proc.stdout.readline().strip() == "asleep"
    return proc.pid


def _rank0_idle_rank1_in_barrier(tmp_path, pid: int, gpu: RecordedGpuProbe):
    run, clock = new_run(tmp_path), Clock(time.time())
    w = Writer(run, clock, host=this_host())
    monitor = Monitor(run, clock=clock, explain_logs=False, capture_stacks=False, gpu_probe=gpu)
    w.start(pids=[pid, os.getpid()])
    since = clock.t
    w.ev(1, "collective_start", op="barrier", seq=1, group="default")
    snaps = []
    for _ in range(8):
        clock.t += 1.0
        w.ev(
            0,
            "heartbeat",
            step=0,
            phase="eval",
            open=None,
            cpu_s=2.0,
            io_bytes=10,
            frame="train.py:90 evaluate",
            where="train.py:90 evaluate",
        )
        w.ev(
            1,
            "heartbeat",
            step=0,
            phase="train",
            cpu_s=2.0,
            io_bytes=10,
            frame="c10d.py:1 barrier",
            where="train.py:70 main",
            open={"op": "barrier", "seq": 1, "group": "default", "since_t": since},
        )
        snaps.append(monitor.poll())
    return snaps


def test_a_rank_whose_gpu_works_is_waited_for_not_a_hang(tmp_path):
    with background(SLEEPER, env=run_env(tmp_path / "run")) as proc:
        gpu = RecordedGpuProbe({proc.pid: 92.0})
        snaps = _rank0_idle_rank1_in_barrier(tmp_path, _asleep(proc), gpu)
    last = snaps[-1]
    assert last.verdict is Verdict.RUNNING
    assert last.ranks[0].activity.state is ActivityState.GPU_WAIT
    assert last.ranks[0].activity.gpu_util_pct == 92.0
    assert last.waits[0].busy and "waiting on its GPU" in last.waits[0].summary
    assert 1 <= gpu.calls <= 8  # only the rank waited on, at most once a second


def test_the_same_rank_with_an_idle_gpu_is_the_culprit_of_a_hang(tmp_path):
    with background(SLEEPER, env=run_env(tmp_path / "run")) as proc:
        gpu = RecordedGpuProbe({proc.pid: 0})
        snaps = _rank0_idle_rank1_in_barrier(tmp_path, _asleep(proc), gpu)
    last = snaps[-1]
    assert last.verdict is Verdict.HANG and last.culprits == {0} and last.confirmed
    assert last.ranks[0].activity.state is ActivityState.BLOCKED


def test_children_cpu_tells_working_workers_from_idle_ones():
    probe = CpuLooks()
    with background(SPINNER) as spinner:
        time.sleep(0.3)
        assert probe.sample(os.getpid(), time.monotonic()).child_pct is None  # the first look
        time.sleep(1.0)
        busy = probe.sample(os.getpid(), time.monotonic()).child_pct
        spinner.kill()
        spinner.wait(5)
    with background(SLEEPER):
        time.sleep(0.3)
        probe = CpuLooks()
        probe.sample(os.getpid(), time.monotonic())
        time.sleep(1.0)
        idle = probe.sample(os.getpid(), time.monotonic()).child_pct
    assert busy is not None and busy > 5.0
    assert idle is not None and idle < 5.0


def test_the_watchers_own_look_tells_a_spinning_process_from_a_sleeping_one():
    probe = CpuLooks()
    with background(SPINNER) as spinner, background(SLEEPER) as sleeper:
        time.sleep(1.5)  # both past their start-up (imports: CPU)
        for proc in (spinner, sleeper):
            assert probe.sample(proc.pid, time.monotonic()).own_pct is None  # the first look
        # a look too soon after the last says nothing (CPU time moves in ticks)
        assert probe.sample(spinner.pid, time.monotonic()).own_pct is None
        time.sleep(1.0)
        busy = probe.sample(spinner.pid, time.monotonic()).own_pct
        idle = probe.sample(sleeper.pid, time.monotonic()).own_pct
    # the threshold the judgement uses (BUSY_CPU of a core, its CPU wait counted)
    assert busy is not None and busy > 100 * BUSY_CPU
    assert idle is not None and idle < 100 * BUSY_CPU


def test_nvml_probe_without_a_gpu_answers_nothing():
    assert NvmlProbe().utilization([os.getpid()]) == {}
