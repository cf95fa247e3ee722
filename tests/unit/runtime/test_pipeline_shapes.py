"""The shapes in the pipeline contract (runtime/pipeline_shapes.py): what stage s declared it
sends against what stage s+1 declared it receives, compared by the second side to arrive over a
real c10d store; undeclared (inferred) shapes compare nothing."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage

from ddpdoctor.monitor.judge.rules.contract import parse
from ddpdoctor.runtime import pipeline_shapes

MB = torch.zeros(4, 24, requires_grad=True)
BATCH = torch.zeros(16, 24, requires_grad=True)


def meta(*shapes):
    return tuple(SimpleNamespace(shape=torch.Size(s), dtype=torch.float32) for s in shapes)


def stage(index, count, inputs=None, outputs=None):
    user = SimpleNamespace(inputs=inputs, outputs=outputs)
    return SimpleNamespace(stage_index=index, num_stages=count, _user_meta=user)


def where(line):
    return lambda _stage: ("/w/train_pp.py", line, "build_stage")


def run_ranks(per_rank):
    """Each rank's sides published in turn on one store, as ranks arriving one after another."""
    store = dist.HashStore()
    out = []
    for rank, (stages, line) in enumerate(per_rank):
        sides = pipeline_shapes.sides_of(stages, rank, where(line))
        out.append(pipeline_shapes.compare_on(store, "pipeline1", "the schedule", sides, 7.0))
    return out


def test_a_receiver_declaring_the_whole_batch_is_a_difference_naming_both_stages_and_lines():
    first, second = run_ranks(
        [
            ([stage(0, 2, meta((16, 24)), meta((4, 24)))], 30),
            ([stage(1, 2, meta((16, 24)), meta((4, 24)))], 31),
        ]
    )
    assert first == []  # the first side to arrive never waits and never compares
    [message] = second
    summary, culprits, file, line, t = parse(message)
    assert culprits == (0, 1) and (file, line, t) == ("/w/train_pp.py", 30, 7.0)
    assert "stage 0 (rank 0) sends [4, 24] float32" in summary
    assert "stage 1 (rank 1) expects [16, 24] float32" in summary


def test_matching_or_undeclared_shapes_compare_nothing():
    same = run_ranks([([stage(0, 2, None, meta((4, 24)))], 1), ([stage(1, 2, meta((4, 24)))], 2)])
    inferred = run_ranks([([stage(0, 2, None, meta((4, 24)))], 1), ([stage(1, 2)], 2)])
    assert same == [[], []] and inferred == [[], []]


def test_three_stages_compare_each_boundary_once_whichever_rank_arrives_last():
    ranks = [
        ([stage(1, 3, meta((4, 24)), meta((4, 8)))], 11),
        ([stage(2, 3, meta((4, 8)), meta((4, 1)))], 12),
        ([stage(0, 3, meta((4, 24)), meta((4, 12)))], 10),
    ]
    messages = [m for rank in run_ranks(ranks) for m in rank]
    [message] = messages
    assert parse(message)[1] == (0, 2)  # the stages' ranks in this run: stage 0 is rank 2
    assert "stage 0 (rank 2) sends [4, 12] float32" in message
    assert "stage 1 (rank 0) expects [4, 24] float32" in message


def test_two_stages_on_one_rank_are_compared_in_the_process():
    stages = [stage(0, 4, None, meta((4, 24))), stage(1, 4, meta((4, 12)), meta((4, 24)))]
    [message] = run_ranks([(stages, 5)])[0]
    assert parse(message)[1] == (0,)


def test_torchs_own_stage_declarations_are_read():
    # the real PipelineStage keeps what the user declared apart from what it infers
    real = PipelineStage.__new__(PipelineStage)
    object.__setattr__(real, "_user_meta", SimpleNamespace(inputs=None, outputs=None))
    assert pipeline_shapes.declared(real) == (None, None)
    from torch.distributed.pipelining._utils import extract_tensor_metas

    user = SimpleNamespace(
        inputs=extract_tensor_metas((BATCH,)), outputs=extract_tensor_metas((MB,))
    )
    object.__setattr__(real, "_user_meta", user)
    assert pipeline_shapes.declared(real) == ("[16, 24] float32", "[4, 24] float32")
