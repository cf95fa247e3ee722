"""The user's thread: stacks, the current line and a hang's culprit line come from the thread
that runs the user's code, which in a Ray Train worker is not the main thread."""

from __future__ import annotations

import threading

from ddpdoctor.runtime import progress_probe
from ddpdoctor.stacks.groups import (
    Frame,
    RankStacks,
    StackCapture,
    ThreadStack,
    group_stacks,
)

RAY = "/venv/lib/python3.11/site-packages/ray"


def _ray_train_worker(rank: int, line: int) -> RankStacks:
    """A Ray Train worker as py-spy sees it: the main thread in Ray's task loop, the training
    function in "TrainingThread(train_func)", Ray's monitor thread beside it."""
    main = ThreadStack(
        1,
        "MainThread",
        (
            Frame("<module>", f"{RAY}/_private/workers/default_worker.py", 330),
            Frame("main_loop", f"{RAY}/_private/worker.py", 1000),
            Frame("run_task_loop", "_raylet.so", 0, native=True),
        ),
        is_main=True,
    )
    monitor = ThreadStack(
        2,
        "MonitoringThread(train_func)",
        (Frame("get", "/usr/lib/python3.11/queue.py", 171),),
    )
    training = ThreadStack(
        3,
        "TrainingThread(train_func)",
        (
            Frame("_run", "/usr/lib/python3.11/threading.py", 982),
            Frame("_run_target", f"{RAY}/train/v2/_internal/thread_runner.py", 40),
            Frame("train_func", "/jobs/ray_train.py", line),
            Frame("sleep", "time", 0, native=True),
        ),
    )
    return RankStacks(rank, 100 + rank, (main, monitor, training))


def test_a_ray_train_worker_is_grouped_by_its_training_thread():
    capture = StackCapture(
        "c1",
        None,
        0.0,
        (_ray_train_worker(0, 41), _ray_train_worker(1, 44), _ray_train_worker(2, 41)),
    )
    groups = group_stacks(capture)
    assert [g.ranks for g in groups] == [(0, 2), (1,)]
    assert groups[1].thread == "TrainingThread(train_func)"
    assert "ray_train.py:44 train_func" in groups[1].frames


def test_a_script_is_grouped_by_its_main_thread_even_with_user_threads_beside_it():
    main = ThreadStack(1, "MainThread", (Frame("main", "/jobs/train.py", 10),), is_main=True)
    helper = ThreadStack(2, "prefetch", (Frame("loop", "/jobs/prefetch.py", 5),))
    entry = RankStacks(0, 10, (main, helper))
    assert entry.user_thread is main


def test_the_heartbeat_reads_the_line_of_the_thread_that_runs_the_users_code():
    """A training function in a thread while the main thread waits in library code only (as in
    a Ray Train worker): the heartbeat's where names the training function's line."""
    started = threading.Event()
    release = threading.Event()

    def train_func():  # this test file is the user's code
        started.set()
        release.wait(10)

    trainer = threading.Thread(target=train_func, name="TrainingThread(train_func)")
    library_only = threading.Thread(target=release.wait, args=(10,), name="ray-task-loop")
    trainer.start()
    library_only.start()
    try:
        assert started.wait(10)
        frames = progress_probe.current_frames()
        # the main thread as a Ray worker's: nothing of the user's code on its stack
        frames[threading.main_thread().ident] = frames[library_only.ident]
        del frames[library_only.ident]
        fields = progress_probe.main_thread_frames(frames)
        assert fields["thread"] == "TrainingThread(train_func)"
        assert fields["where"].startswith("test_user_thread.py:")
        assert fields["where"].endswith(" train_func")
    finally:
        release.set()
        trainer.join(10)
        library_only.join(10)


def test_the_main_thread_is_the_users_when_its_code_is_there():
    fields = progress_probe.main_thread_frames()
    assert "thread" not in fields
    assert fields["where"].startswith("test_user_thread.py:")
