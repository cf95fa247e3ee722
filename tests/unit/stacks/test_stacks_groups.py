"""Parsing recorded py-spy dumps, folding library frames, grouping ranks by stack."""

from __future__ import annotations

import json

import pytest

from ddpdoctor.stacks.capture import load_capture
from ddpdoctor.stacks.groups import (
    Frame,
    RankStacks,
    StackCapture,
    ThreadStack,
    fold_frames,
    group_stacks,
    innermost_frame,
    is_library_frame,
    library_label,
    parse_pyspy_dump,
    thread_groups,
)
from tests.procs import REPO

STACKS = REPO / "tests" / "fixtures" / "stacks"
# Recorded with py-spy 0.4.3 --native on a real 2-rank gloo job (torch 2.14.1): rank 0 blocked in
# dist.barrier(), rank 1 sleeping in a Python loop.
BARRIER_VS_SLEEP = STACKS / "gloo-barrier-vs-sleep"


def recorded(name: str, pid: int = 1) -> tuple[ThreadStack, ...]:
    return parse_pyspy_dump(json.loads((BARRIER_VS_SLEEP / name).read_text()), pid)


def test_frames_are_innermost_last_with_native_frames_marked():
    (thread,) = recorded("rank-0.json")
    assert thread.is_main and thread.name == "MainThread"
    assert thread.frames[0].native and thread.frames[0].file.endswith("libc.so.6")
    python = [f for f in thread.frames if not f.native]
    assert [f.function for f in python] == [
        "<module>",
        "main",
        "_exception_logger.<locals>.wrapper",
        "barrier",
    ]
    assert thread.frames[-1].native  # pthread_cond_wait, innermost


def test_folding_keeps_user_frames_and_the_collective():
    (thread,) = recorded("rank-0.json")
    assert fold_frames(thread.frames) == (
        "… 1 native frame (libc.so.6)",
        "rank_job.py:18 <module>",
        "rank_job.py:14 main",
        "… 1 library frame (torch/distributed)",
        "distributed_c10d.py:6371 barrier",
        "… 6 native frames (libtorch_python.so, libtorch_cpu.so, libstdc++.so.6.0.30, …)",
    )


def test_a_captured_pair_groups_into_two_classes():
    capture = load_capture(BARRIER_VS_SLEEP)
    assert [r.rank for r in capture.ranks] == [0, 1] and capture.errors == {}
    groups = group_stacks(capture)
    assert [g.ranks for g in groups] == [(0,), (1,)]
    assert innermost_frame(groups[0].frames) == "distributed_c10d.py:6371 barrier"
    assert innermost_frame(groups[1].frames) == "rank_job.py:6 sleep_in_python_loop"
    assert groups[1].full_frames[-3].endswith("/rank_job.py:6 sleep_in_python_loop")
    assert groups[0].thread == "MainThread"


def _rank(rank: int, frames: tuple[Frame, ...], name: str = "MainThread") -> RankStacks:
    return RankStacks(rank, 100 + rank, (ThreadStack(1, name, frames, is_main=True),))


USER = Frame("<module>", "/home/u/train.py", 10)
STEP = Frame("train_step", "/home/u/train.py", 42)
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
ALL_REDUCE = Frame("all_reduce", C10D, 2800)
WRAPPER = Frame(
    "wrapper", "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", 83
)
LOADER = Frame("_next_data", "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1)
QUEUE = Frame("get", "/usr/lib/python3.11/queue.py", 180)
WAIT = Frame("wait", "/usr/lib/python3.11/threading.py", 320)


def test_the_odd_rank_out_is_its_own_class_after_the_biggest():
    waiting = (USER, STEP, WRAPPER, ALL_REDUCE)
    stuck = (USER, STEP, LOADER, QUEUE, WAIT)
    capture = StackCapture(
        "c1",
        None,
        0.0,
        (
            _rank(0, waiting),
            _rank(1, stuck),
            _rank(2, waiting),
            _rank(3, waiting),
            RankStacks(4, 104, error="process 104 not found (it exited)"),
        ),
    )
    groups = group_stacks(capture)
    assert [g.ranks for g in groups] == [(0, 2, 3), (1,)]
    assert groups[1].frames == (
        "train.py:10 <module>",
        "train.py:42 train_step",
        "… 3 library frames (torch/utils, queue, threading)",
    )


def test_ranks_at_different_lines_are_different_classes():
    other_line = Frame("train_step", "/home/u/train.py", 43)
    capture = StackCapture("c", None, 0.0, (_rank(0, (USER, STEP)), _rank(1, (USER, other_line))))
    assert len(group_stacks(capture)) == 2


def test_the_main_thread_is_chosen_and_other_threads_stay_available():
    threads = parse_pyspy_dump(json.loads((STACKS / "two-threads-rank-0.json").read_text()), 1)
    assert [t.name for t in threads] == ["sleeper", "MainThread"]  # py-spy's order
    capture = StackCapture("c", None, 0.0, (RankStacks(0, 1, threads),))
    (group,) = group_stacks(capture)
    assert group.thread == "MainThread"
    assert innermost_frame(group.frames) == "blocked.py:3 wait_for_godot"
    detail = thread_groups(capture, 0)
    assert [g.thread for g in detail] == ["sleeper", "MainThread"]
    assert "blocked.py:5 main.<locals>.<lambda>" in detail[0].frames


def test_a_thread_without_a_name_is_main_when_it_is_the_process_itself():
    data = [
        {"thread_id": 7, "os_thread_id": 555, "frames": [], "thread_name": None},
        {"thread_id": 8, "os_thread_id": 42, "frames": [], "thread_name": None},
    ]
    threads = parse_pyspy_dump(data, 42)
    assert [t.is_main for t in threads] == [False, True]


def test_bad_dumps_are_errors_not_crashes():
    with pytest.raises(ValueError):
        parse_pyspy_dump({"not": "a list"}, 1)
    assert parse_pyspy_dump([1, "x", {"frames": [None, {"name": "f"}]}], 1)[0].frames[0].line == 0


@pytest.mark.parametrize(
    ("path", "library", "label"),
    [
        ("/home/u/train.py", False, "train"),
        (C10D, True, "torch/distributed"),
        ("/venv/lib/python3.11/site-packages/numpy/core/numeric.py", True, "numpy"),
        ("/usr/lib/python3.11/threading.py", True, "threading"),
        ("<frozen runpy>", True, "runpy"),
        ("/work/ddpdoctor/runtime/hooks.py", True, "ddpdoctor"),
        ("/src/pytorch/torch/nn/modules/module.py", True, "torch/nn"),
    ],
)
def test_what_counts_as_library_code(path, library, label):
    frame = Frame("f", path, 1)
    assert is_library_frame(frame) is library
    assert library_label(frame) == label


def test_load_capture_without_a_summary_reads_the_dumps(tmp_path):
    for name in ("rank-0.json", "rank-1.json"):
        (tmp_path / name).write_text((BARRIER_VS_SLEEP / name).read_text())
    (tmp_path / "rank-2.json").write_text("{torn")
    capture = load_capture(tmp_path)
    assert [r.rank for r in capture.ranks] == [0, 1, 2]
    assert capture.ranks[0].pid == 24641  # from the dump itself
    assert "unreadable dump" in capture.errors[2]
    assert len(group_stacks(capture)) == 2


def test_a_ddp_all_reduce_under_backward_shows_where_c10d_waits():
    # Rank 0 of a real hung reference job (py-spy 0.4.3 --native): blocked in DDP's gradient
    # all-reduce under loss.backward(), no distributed_c10d.py frame on the stack.
    def native(function: str, lib: str) -> Frame:
        return Frame(function, f"/venv/torch/lib/{lib}", 0, native=True)

    frames = (
        Frame("train_loop", "/work/job/train.py", 314),
        Frame("Tensor.backward", "/venv/lib/python3.11/site-packages/torch/_tensor.py", 623),
        native("THPEngine_run_backward", "libtorch_python.so"),
        native("torch::autograd::Engine::execute", "libtorch_cpu.so"),
        native("c10d::Reducer::mark_variable_ready", "libtorch_cpu.so"),
        native("c10d::Reducer::finalize_backward", "libtorch_cpu.so"),
        native("std::condition_variable::wait", "libstdc++.so.6"),
        native("pthread_cond_wait", "libc.so.6"),
    )
    folded = fold_frames(frames)
    assert folded == (
        "train.py:314 train_loop",
        "… 4 library frames (torch, libtorch_python.so, libtorch_cpu.so)",
        "c10d::Reducer::finalize_backward (libtorch_cpu.so)",
        "… 2 native frames (libstdc++.so.6, libc.so.6)",
    )
    assert innermost_frame(folded) == "c10d::Reducer::finalize_backward (libtorch_cpu.so)"


LIGHTNING = STACKS / "lightning-barrier"


def test_a_lightning_stack_keeps_the_frames_that_explain_it():
    """Recorded: rank 0 of a Lightning job in a barrier that `_sync_ddp` issued under
    `Trainer.fit`; the 17 Lightning frames between fold, the two that explain stay."""
    (thread,) = (
        t
        for t in parse_pyspy_dump(json.loads((LIGHTNING / "rank-0.json").read_text()), 1)
        if t.is_main
    )
    assert fold_frames(thread.frames) == (
        "… 1 native frame (libc.so.6)",
        "lit_barrier_rank0.py:50 <module>",
        "lit_barrier_rank0.py:46 main",
        "trainer.py:584 Trainer.fit",
        "… 15 library frames (lightning)",
        "distributed.py:213 _sync_ddp",
        "… 2 library frames (ddpdoctor, torch/distributed)",
        "distributed_c10d.py:6371 barrier",
        "… 6 native frames (libtorch_python.so, libtorch_cpu.so, libstdc++.so.6.0.30, …)",
    )


def test_a_framework_frame_called_by_the_user_stays_visible():
    site = "/venv/lib/python3.11/site-packages/lightning/pytorch/strategies/ddp.py"
    hook = Frame("Model.on_train_epoch_end", "/home/u/lit_job.py", 27)
    strategy = Frame("DDPStrategy.barrier", site, 303)
    frames = (USER, hook, strategy, WRAPPER, Frame("barrier", C10D, 6371))
    assert fold_frames(frames) == (
        "train.py:10 <module>",
        "lit_job.py:27 Model.on_train_epoch_end",
        "ddp.py:303 DDPStrategy.barrier",
        "… 1 library frame (torch/distributed)",
        "distributed_c10d.py:6371 barrier",
    )
