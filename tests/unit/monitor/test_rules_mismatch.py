from __future__ import annotations

from ddpdoctor.monitor.judge.rules import mismatch
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from tests.unit.monitor.test_monitor_builders import coll, snap, view


def at(rank, current, **kw):
    return view(rank, RankState.WAITING, collective=current, seq=40, **kw)


def test_barrier_against_all_reduce_names_both_sides():
    ranks = [at(0, coll("barrier", 41, 3.0)), at(1, coll("all_reduce", 41, 3.0))]
    out = mismatch.detect(snap(ranks))
    assert out is not None and out.verdict is Verdict.MISMATCH
    text = out.findings[0].summary
    assert "rank 0: barrier #41" in text and "rank 1: all_reduce #41 of [10] float32" in text
    assert text.startswith("collective mismatch at #41")


def test_rare_call_against_the_usual_one_is_the_culprit():
    ranks = [at(0, coll("barrier", 41, 3.0)), at(1, coll("all_reduce", 41, 3.0))]
    out = mismatch.detect(snap(ranks))
    assert out.culprits == {0}  # rank 1's all_reduce [10] is what every step does


def test_same_op_different_shapes():
    ranks = [
        at(0, coll("all_reduce", 41, 1.0, shapes=((10,),))),
        at(1, coll("all_reduce", 41, 1.0, shapes=((11,),)), fault="shape:rank=1,step=5"),
    ]
    out = mismatch.detect(snap(ranks))
    assert out.culprits == {1}  # the rank that recorded the injected fault
    assert "all_reduce #41 of [11] float32" in out.findings[0].summary


def test_shapes_that_differ_only_in_dimensions_of_size_1_agree():
    """DeepSpeed's pipeline engine reduces a gradient norm held as a scalar on one stage and as
    a one-element tensor on the other: the backend sees one float each, and the job is healthy.
    A transposed tensor is another layout and still a mismatch."""
    scalar = [
        at(0, coll("all_reduce", 41, 1.0, shapes=((),))),
        at(1, coll("all_reduce", 41, 1.0, shapes=((1,),))),
    ]
    assert mismatch.detect(snap(scalar)) is None
    transposed = [
        at(0, coll("all_reduce", 41, 1.0, shapes=((4, 3),))),
        at(1, coll("all_reduce", 41, 1.0, shapes=((3, 4),))),
    ]
    assert mismatch.detect(snap(transposed)) is not None


def test_same_op_different_dtypes():
    ranks = [
        at(0, coll("all_reduce", 41, 1.0, dtypes=("float32",))),
        at(1, coll("all_reduce", 41, 1.0, dtypes=("float64",))),
    ]
    assert mismatch.detect(snap(ranks)) is not None


def test_matching_collectives_are_fine():
    assert mismatch.detect(snap([view(0), view(1)])) is None
    ranks = [at(0, coll("all_reduce", 41, 1.0)), at(1, coll("all_reduce", 41, 1.0))]
    assert mismatch.detect(snap(ranks)) is None


def test_object_collectives_may_differ_in_shape():
    ranks = [
        at(0, coll("all_gather_object", 41, 1.0, shapes=((120,),))),
        at(1, coll("all_gather_object", 41, 1.0, shapes=((96,),))),
    ]
    assert mismatch.detect(snap(ranks)) is None


def test_finished_collectives_in_the_history_are_compared_too():
    r0 = view(0, recent_collectives=(coll("all_reduce", 7, 0.01, done=True),), seq=7)
    r1 = view(1, recent_collectives=(coll("broadcast", 7, 0.01, done=True),), seq=7)
    out = mismatch.detect(snap([r0, r1]))
    assert out is not None and "#7" in out.findings[0].summary


def test_lowest_mismatching_seq_is_reported():
    r0 = view(0, recent_collectives=(coll("barrier", 5), coll("barrier", 6)), seq=6)
    r1 = view(1, recent_collectives=(coll("all_reduce", 5), coll("all_reduce", 6)), seq=6)
    out = mismatch.detect(snap([r0, r1]))
    assert "#5" in out.findings[0].summary


def test_a_rank_that_aborted_before_recording_its_call_is_read_from_its_stderr():
    from ddpdoctor.monitor.model.snapshot import LogLine

    abort = LogLine(
        "rank 0 stderr",
        "  what():  [enforce fail at pair.cc:464] op.preamble.length <= op.nbytes. 8 vs 4. "
        "Received data size doesn't match expected size. Is there a distributed collective "
        "mismatch in your code?",
        0,
        "error",
        "logs/vm/x/attempt_0/0/stderr.log",
        2,
    )
    r0 = view(0, RankState.GONE, seq=8, error_lines=(abort,), exit_signal="SIGABRT")
    peer_call = coll("all_reduce", 9, 0.2, shapes=((5,),), dtypes=("int64",))
    r1 = view(
        1,
        RankState.FAILED,
        seq=8,
        recent_collectives=(peer_call,),
        error="RuntimeError: Connection reset by peer",
    )
    out = mismatch.detect(snap([r0, r1]))
    assert out is not None and out.verdict is Verdict.MISMATCH and out.culprits == {0, 1}
    text = out.findings[0].summary
    assert "rank 1: all_reduce #9 of [5] int64" in text and "rank 0: a different call" in text
    assert out.findings[0].evidence[0].file.endswith("0/stderr.log")


def test_an_abort_in_a_mesh_group_is_read_at_that_groups_next_number():
    from ddpdoctor.monitor.model.snapshot import LogLine

    abort = LogLine(
        "rank 0 stderr",
        "Received data size doesn't match expected size. Is there a distributed collective "
        "mismatch in your code?",
        0,
        "error",
        "logs/vm/x/attempt_0/0/stderr.log",
        1,
    )
    tp = dict(group="3", shapes=((16,),), dtypes=("float32",))
    own = (coll("all_reduce", 4, 0.0, done=True, **tp),)
    r0 = view(0, RankState.GONE, seq=8, recent_collectives=own, error_lines=(abort,),
              group_seqs=(("default", 8), ("3", 4)))  # fmt: skip
    peer = coll("all_gather_tensor", 5, 0.2, **tp)
    r1 = view(1, RankState.FAILED, seq=8, recent_collectives=(peer,),
              group_seqs=(("default", 8), ("3", 5)))  # fmt: skip
    out = mismatch.detect(snap([r0, r1]))
    assert out is not None and out.verdict is Verdict.MISMATCH
    assert out.findings[0].summary.startswith("collective mismatch at #5 of group 3: ")


def test_no_abort_message_no_inferred_mismatch():
    r0 = view(0, RankState.GONE, seq=8, exit_signal="SIGKILL")
    r1 = view(1, RankState.FAILED, seq=8, recent_collectives=(coll("all_reduce", 9),))
    assert mismatch.detect(snap([r0, r1])) is None
