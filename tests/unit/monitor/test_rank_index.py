"""The rank index (ddpdoctor/monitor/model/rank_index.py) changes how the rules find ranks, never
what they say: on random snapshots, each rule that reads it and the whole diagnosis say the same
with the index and walking every rank (index_check.same_both_ways), in full."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from ddpdoctor.monitor.judge.diagnose import CHECK_INDEX, diagnose
from ddpdoctor.monitor.judge.rules import chance_pairing, sampler, straggler
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.pairings import PairingsView
from ddpdoctor.monitor.model.replicas import ReplicaDigest
from ddpdoctor.monitor.model.run_facts import LogLine
from ddpdoctor.monitor.model.snapshot import (
    Activity,
    CallSite,
    CollectiveView,
    RankState,
    RankView,
    Snapshot,
)
from ddpdoctor.protocol.verdicts import ActivityState
from tests.unit.monitor.index_check import same_both_ways
from tests.unit.monitor.test_monitor_builders import NOW, coll, snap, view

OPS = ["all_reduce", "all_reduce", "broadcast", "barrier", "send", "recv", "all_gather"]
GROUPS = ["default", "default", "tp", "default:ddp_grads"]
WARNINGS = [
    (sampler.SET_EPOCH, "DistributedSampler.set_epoch() is never called"),
    ("init.world_size_mismatch", "world_size=4 but 2 ranks launched"),
    ("spmd.contract_mismatch", "ranks built different models [culprits 1 line job.py:3 t 5.0]"),
    ("pipeline.contract_mismatch", "stages differ [culprits 0,1]"),
    ("data.something", "a warning no rule interprets"),
]
ERROR_TEXTS = [
    "RuntimeError: Detected mismatch between collectives on ranks",
    "RuntimeError: Connection closed by peer",
    "NCCL WARN something",
]
# own work as runs report it, and the values whose sums could differ if added the wrong way
WORK = [0.1, 0.1, 0.11, 0.5, 0.0, -0.0, 0.3, 1, 0, float("nan"), float("inf"), None]


def _coll(rng: random.Random, seq: int, **kw: Any) -> CollectiveView:
    op = rng.choice(OPS)
    group = rng.choice(GROUPS)
    shapes = rng.choice([((10,),), ((10,),), ((4, 3),), ((1,),), ()])
    site = rng.choice([None, CallSite("job.py:3 main", file="job.py", line=3), CallSite("b.py:9")])
    peers = (rng.randrange(8),) if op in ("send", "recv") else ()
    return CollectiveView(
        op, seq, rng.choice([0.01, 0.5, 3.0, 7.0, 30.0]), group=group, shapes=shapes,
        dtypes=("float32",) if shapes else (), since_t=NOW - rng.choice([0.5, 4.0, 8.0, 40.0]),
        site=site, peers=peers, step=rng.choice([None, 3, 4]), **kw,
    )  # fmt: skip


def _digest(rng: random.Random, step: int) -> ReplicaDigest:
    values = (11, 12, rng.choice([13, 13, 14]))
    return ReplicaDigest(
        model=0, step=step, final=False, buffers=rng.random() < 0.5, sync_buffers=True,
        names=("w", "b", "running_mean"), values=values, calls=(), t=NOW - 10 + step,
    )  # fmt: skip


def random_view(rng: random.Random, rank: int, world: int, mess: float) -> RankView:
    """A rank in training, each of its fields made odd with the chance `mess`."""

    def odd(clean: Any, *odd_ones: Any) -> Any:
        return rng.choice(odd_ones) if rng.random() < mess else clean

    state = odd(RankState.RUNNING, *RankState)
    seq = rng.choice([38, 39, 40, 40, 41])
    recent = tuple(_coll(rng, s, done=True) for s in range(seq - rng.randrange(4), seq + 1))
    kw: dict[str, Any] = {
        "seq": seq,
        "collective": odd(None, _coll(rng, seq + 1), _coll(rng, seq)),
        "recent_collectives": odd(recent, ()),
        "group_seqs": tuple((g, seq + rng.randrange(2)) for g in rng.sample(GROUPS, 2)),
        "calls_key": odd(11, 0, 22, 33),
        "avg_steps": odd(10, 4, 5),
        "avg_data_time_s": odd(rng.choice([0.01, 0.02]), *WORK),
        "avg_compute_time_s": odd(rng.choice([0.1, 0.11]), *WORK),
        "avg_comm_wait_s": odd(0.4, None, 0.01, 0.5),
        "runq_share": odd(None, 0.01, 0.3),
        "step": odd(10, None, 0, 8, 9, 12),
        "collectives_done": odd(40, 0),
        "last_progress_t": odd(NOW - 0.2, NOW - 20.0),
        "exit_code": odd(None, 0, 1, -9),
        "exit_signal": odd(None, "SIGTERM", "SIGKILL"),
        "exit_reason": odd(None, "normal", "exception", "signal"),
        "error": odd(None, *ERROR_TEXTS),
        "failed_t": odd(None, NOW - 2.0, NOW - 1.0),
        "fault": odd(None, "mismatch:rank=1", "hang:rank=0"),
        "warnings": odd((), *(tuple(rng.sample(WARNINGS, n)) for n in (1, 1, 2))),
        "error_lines": odd(
            (), *((LogLine(f"rank {rank} stderr", text, rank, "error"),) for text in ERROR_TEXTS)
        ),
        "loader_batches": odd(((0, 10),), (), ((0, 12),), ((0, 10), (1, 3)), ((0, 10), (0, 12))),
        "replica_digests": odd((), tuple(_digest(rng, s) for s in (8, 16))),
        "heartbeat_age_s": odd(0.5, 6.0),
        "alive": odd(True, None, False),
        "activity": odd(
            None, *(Activity(s, 50.0, "job.py:9 f", rng.choice([1.0, 9.0])) for s in ActivityState)
        ),
        "reports_progress": rng.random() < 0.5,
        "sends_p2p": odd(False, True),
    }
    if rank >= world:  # (a rank repeated: the index keeps the snapshot's order and doubles)
        rank = rng.randrange(world)
    return view(rank, state, **kw)


def random_snapshot(rng: random.Random) -> Snapshot:
    world = rng.choice([1, 2, 3, 5, 8, 16, 33])
    mess = rng.choice([0.0, 0.02, 0.1, 0.3, 1.0])
    ranks = [random_view(rng, r, world, mess) for r in range(world + (rng.random() < 0.05))]
    fed = frozenset(r for r in range(world) if rng.random() < 0.7)
    pairings = rng.choice([None, PairingsView(fed=fed), PairingsView(fed=frozenset(range(world)))])
    return snap(ranks, pairings=pairings, hang_after=rng.choice([5.0, 2.0]))


@pytest.mark.parametrize("seed", range(32))
def test_every_rule_says_the_same_with_the_index_on_random_snapshots(seed):
    rng = random.Random(seed)
    for _ in range(25):
        same_both_ways(random_snapshot(rng))


def test_steady_ranks_leave_the_lists_empty_and_own_work_as_the_walk_sums_it():
    """Ranks in step, at full steps: nothing failed, warned or waiting to look at; own work,
    classes and the straggler as the walk over every rank makes them."""
    ranks = [
        view(
            r,
            avg_steps=10,
            avg_data_time_s=0.01 * (r % 3),
            avg_compute_time_s=0.1,
            avg_comm_wait_s=2.0,
            calls_key=7 if r % 4 else 9,
        )
        for r in range(40)
    ]
    ranks[13] = replace(ranks[13], avg_data_time_s=-0.0, avg_compute_time_s=-0.0)
    ranks[17] = replace(ranks[17], avg_compute_time_s=2.0, avg_comm_wait_s=0.01)  # a straggler
    ranks[21] = replace(ranks[21], avg_data_time_s=None, avg_compute_time_s=None)
    ranks[22] = replace(ranks[22], avg_data_time_s=1, avg_compute_time_s=None)
    ranks[23] = replace(ranks[23], avg_steps=4)
    ranks[30] = replace(ranks[30], state=RankState.IN_COLLECTIVE, collective=coll(seq=41))
    steady = snap(ranks)
    index = rank_index.of(steady)
    assert index.narrow and rank_index.of(steady) is index  # one per snapshot
    assert index.unsettled == [] and index.with_warnings == [] and index.with_error_lines == []
    assert index.in_collective == [ranks[30]] and index.with_calls == ranks
    assert list(index.call_classes.items()) == [(9, ranks[0]), (7, ranks[1])]
    own = straggler.own_work(steady)
    assert 21 not in own and 23 not in own and repr(own[22]) == "1.0"
    assert repr(own[13]) == "0.0"  # (-0.0 or 0.0) + (-0.0 or 0.0), not -0.0
    with rank_index.walking_every_rank():
        assert not rank_index.of(steady).narrow
        assert repr(list(straggler.own_work(steady).items())) == repr(list(own.items()))
    assert straggler.detect(steady).findings[0].ranks == (17,)
    same_both_ways(steady)


def test_a_new_snapshot_gets_its_own_index():
    first = snap([view(0), view(1, RankState.FAILED)])
    assert [v.rank for v in rank_index.of(first).unsettled] == [1]
    second = replace(first, ranks=(view(0, RankState.FAILED), view(1)))
    assert [v.rank for v in rank_index.of(second).unsettled] == [0]
    assert first == replace(first)  # (the index is no field: eq ignores it)


def test_the_check_catches_an_index_that_leaves_a_rank_out(monkeypatch):
    """A list short of one rank changes a rule's outcome, and DDPDOCTOR_CHECK_INDEX says so."""
    walk = rank_index.RankIndex._walk

    def short(self, ranks):
        walk(self, ranks)
        self.unsettled = self.unsettled[1:]

    monkeypatch.setattr(rank_index.RankIndex, "_walk", short)
    monkeypatch.setenv(CHECK_INDEX, "1")
    failed = view(0, RankState.FAILED, error="RuntimeError: boom", failed_t=NOW - 1)
    crashed = Snapshot(run=snap([]).run, taken_t=NOW, ranks=(failed, replace(failed, rank=1)))
    with pytest.raises(AssertionError, match="rank index changed the diagnosis"):
        diagnose(crashed)


def test_a_pairing_in_the_calls_of_the_one_rank_not_fed_is_found():
    """The only rank whose calls the monitor did not read is the last one with calls: it alone
    makes chance_pairing compare the latest calls (a list short of it would not)."""
    train = CallSite("train.py:58 main", file="/w/train.py", line=58)
    evaluate = CallSite("train.py:32 evaluate", file="/w/train.py", line=32)

    def gathers(sites: list[CallSite]) -> tuple[CollectiveView, ...]:
        return tuple(
            CollectiveView("all_gather_into_tensor", seq, 0.01, shapes=((64,),),
                           dtypes=("float32",), done=True, site=site)
            for seq, site in enumerate(sites, start=10)
        )  # fmt: skip

    ranks = [view(r, recent_collectives=gathers([train] * 3)) for r in range(3)]
    ranks.append(view(3, recent_collectives=gathers([train, evaluate, train])))
    ranks.append(view(4, recent_collectives=()))
    paired = snap(ranks, pairings=PairingsView(fed=frozenset({0, 1, 2, 4})))
    finding = chance_pairing.detect(paired).findings[0]
    assert finding.ranks == (3,)
    same_both_ways(paired)


def test_loaders_alike_on_every_rank_are_even_unless_one_loader_comes_twice():
    alike = snap([view(r, loader_batches=((0, 10), (1, 3))) for r in range(4)])
    assert rank_index.of(alike).loader_batches == [((0, 10), (1, 3))] * 4
    assert sampler.detect(alike) is None
    twice = snap([view(r, loader_batches=((0, 10), (0, 12))) for r in range(4)])
    assert [f.id for f in sampler.detect(twice).findings] == [sampler.UNEVEN]
    one_off = snap([view(r, loader_batches=((0, 10 + (r == 2)),)) for r in range(4)])
    assert sampler.detect(one_off).findings[0].ranks == (0, 1, 3)
    for each in (alike, twice, one_off):
        same_both_ways(each)
