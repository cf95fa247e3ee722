"""Calls paired by chance, found as the monitor reads each call (model/pairings.py), whatever
the moment of the polls: recorded ZeRO-3 / FSDP-like event streams fed through RunState, read
the way the monitor reads two rank files (one ahead of the other), with a poll after each read.
"""

from __future__ import annotations

from typing import Any

from ddpdoctor.monitor.judge import diagnose
from ddpdoctor.monitor.judge.rules import chance_pairing
from ddpdoctor.monitor.model.pairings import MAX_OPEN, PairingLog
from ddpdoctor.monitor.model.snapshot import CallSite, CollectiveView, RunInfo
from ddpdoctor.monitor.model.state import RunState
from tests.unit.monitor.test_monitor_builders import NOW

SCRIPT = "/w/ds_zero.py"
WRAPPED = {"file": "deepspeed/utils/nvtx.py", "line": 33, "function": "wrapped_fn"}
GATHER_ISSUER = {"file": "deepspeed/comm/torch.py", "line": 380, "function": "all_gather"}


def site(line: int, function: str = "main", **via: Any) -> dict[str, Any]:
    return {"file": SCRIPT, "line": line, "function": function, **via}


FORWARD = site(72, via=WRAPPED, issuer=GATHER_ISSUER)  # loss = F.cross_entropy(engine(x), y)
EVALUATE = site(43, "evaluate", via=WRAPPED, issuer=GATHER_ISSUER)  # out = engine(x) in eval
BACKWARD = site(73, via=WRAPPED)  # engine.backward(loss)
OPT_STEP = site(74, via={"file": "deepspeed/runtime/engine.py", "line": 3615, "function": "step"})
GATHER = ("all_gather_into_tensor", [[1186]])


class Rank:
    """One rank's events, as its runtime writes them."""

    def __init__(self, rank: int, world: int = 2) -> None:
        self.rank, self.seq, self.t = rank, 0, 0.0
        self.events: list[dict[str, Any]] = [
            self._ev("hello", local_rank=rank, world_size=world, host="node0", pid=4000 + rank),
            self._ev("phase", phase="train"),
        ]

    def _ev(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.t += 0.001
        return {"v": 1, "t": NOW + self.t, "rank": self.rank, "kind": kind, **fields}

    def call(self, where: dict, step: int, op_shapes: tuple[str, list] = GATHER) -> None:
        op, shapes = op_shapes
        self.seq += 1
        fields = {"op": op, "seq": self.seq, "group": "default", "step": step}
        shapes_of = {"shapes": shapes, "dtypes": ["float32"] * len(shapes)}
        self.events.append(self._ev("collective_start", **fields, **shapes_of, site=where))
        self.events.append(self._ev("collective_end", **fields, duration_s=0.001, ok=True))

    def zero3_step(self, step: int, gathers: int = 40) -> None:
        """A ZeRO-3 training step: the forward's all-gathers (one per parameter), the gradients'
        reduce-scatter, the optimizer's overflow check."""
        for _ in range(gathers):
            self.call(FORWARD, step)
        self.call(BACKWARD, step, ("reduce_scatter_tensor", [[2372]]))
        self.call(OPT_STEP, step, ("all_reduce", [[]]))
        self.events.append(self._ev("step", step=step, step_time_s=0.1))


def read(ranks: list[Rank], lead: int = 50, lag: int = 25, *, blind: bool = True) -> list[Any]:
    """Feed the ranks' events to a RunState the way a monitor reads their files: rank 0 read
    `lead` calls further each time, rank 1 `lag` calls behind it (so that no window of the last
    16 calls of both ranks ever covers the same calls: `blind` checks it), a poll after each
    read. Returns the polls: (diagnosis, its findings kept once said as the monitor keeps
    them; snapshot)."""
    state = RunState(RunInfo(name="t", run_dir="/x", world_size=len(ranks)))
    cursors = [0] * len(ranks)
    said: dict = {}
    polls = []
    target = 0
    while any(cursors[i] < len(r.events) for i, r in enumerate(ranks)):
        target += lead
        for i, r in enumerate(ranks):
            upto = target - (lag if i else 0)
            while cursors[i] < len(r.events):
                event = r.events[cursors[i]]
                if event["kind"] == "collective_start" and event["seq"] > upto:
                    break
                state.apply(event, (f"events/rank-{i}.jsonl", cursors[i] + 1))
                cursors[i] += 1
        snap = state.snapshot(NOW + max(r.t for r in ranks), live=True)
        assert not blind or chance_pairing._in_latest_calls(snap) is None
        polls.append((diagnose.keep_said(diagnose.diagnose(snap), said), snap))
    return polls


def pairings_said(polls: list[Any]) -> list[Any]:
    return [f for f in polls[-1][0].findings if f.id == chance_pairing.CODE]


def test_rank0s_eval_gathers_paired_with_rank1s_training_gathers_are_found_at_step_10():
    r0, r1 = Rank(0), Rank(1)
    for step in range(1, 17):
        for r in (r0, r1):
            r.zero3_step(step)
        if step == 10:
            for _ in range(40):  # rank 0 alone evaluates: 40 all-gathers of the same size
                r0.call(EVALUATE, step)
    polls = read([r0, r1])
    found = pairings_said(polls)
    assert len(found) == 1, [f.summary for f in found]
    summary = found[0].summary
    assert found[0].ranks == (0,) and found[0].severity.value == "warning"
    assert "from ds_zero.py:43 evaluate via wrapped_fn > all_gather at step 10," in summary
    assert "with their all_gather_into_tensor #421 of the same size from ds_zero.py:72" in summary
    assert "rank 0 called all_gather_into_tensor #421 of [1186] float32" in summary
    assert {(e.file, e.line) for e in found[0].evidence if e.file} == {(SCRIPT, 43), (SCRIPT, 72)}
    # said once rank 1 is two steps past its paired call (its step 11), long before the end;
    # a warning, never a verdict
    said_at = next(snap for diagnosis, snap in polls if diagnosis.findings)
    assert said_at.ranks[1].step == 12
    assert all(diagnosis.verdict.value == "running" for diagnosis, _ in polls)


def test_one_evaluation_is_one_pairing_however_far_apart_the_ranks_are_read():
    """Rank 1's file read 300 calls ahead of rank 0's (its side decided as soon as rank 0's
    first eval call is read), or all of it first (a finished run read afterwards)."""
    r0, r1 = Rank(0), Rank(1)
    for step in range(1, 15):
        for r in (r0, r1):
            r.zero3_step(step)
        if step == 10:
            for _ in range(40):
                r0.call(EVALUATE, step)
    for r in (r0, r1):
        r.events.append(r._ev("exit", code=0, reason="normal"))
    for lag in (-300, -10_000):
        found = pairings_said(read([r0, r1], lag=lag))
        assert [f.summary.split(" at step ")[1][:3] for f in found] == ["10,"], lag
        assert "#421 of [1186]" in found[0].summary


def test_two_pairings_are_each_said_with_their_step():
    r0, r1 = Rank(0), Rank(1)
    for step in range(1, 25):
        for r in (r0, r1):
            r.zero3_step(step, gathers=8)
        if step in (10, 20):
            for _ in range(8):
                r0.call(EVALUATE, step)
    found = pairings_said(read([r0, r1], lead=20, lag=18))
    assert [" at step 10," in f.summary for f in found] == [True, False]
    assert " at step 20," in found[1].summary


def test_one_all_reduce_reached_from_two_lines_by_rank_is_no_pairing():
    """`if rank == 0: dist.all_reduce(x)` at line 80, `else: dist.all_reduce(x)` at line 82,
    every step: neither side ever calls from the other's line. Today's rule (call_sites) passes
    such a pair over, and so does this."""
    r0, r1 = Rank(0), Rank(1)
    for step in range(1, 21):
        for r, line in ((r0, 80), (r1, 82)):
            for _ in range(20):
                r.call(FORWARD, step)
            r.call(site(line), step, ("all_reduce", [[10]]))
    assert pairings_said(read([r0, r1], lead=7, lag=3)) == []


def test_a_site_rank1_reaches_one_step_after_rank0_is_no_pairing():
    """Both ranks call from line 90 once, rank 0 at step 5, rank 1 at step 6 (the calls of that
    number pair line 90 with line 72 on the other): 30 calls apart, out of a 16-call window."""
    r0, r1 = Rank(0), Rank(1)
    for step in range(1, 12):
        for r in (r0, r1):
            if (r is r0 and step == 5) or (r is r1 and step == 6):
                r.call(site(90, "checkpoint"), step)
            r.zero3_step(step, gathers=30)
    polls = read([r0, r1], lead=10, lag=0, blind=False)
    assert pairings_said(polls) == []
    # the ranks' latest calls alone, at a poll between the two, looked like a pairing
    assert any(chance_pairing._in_latest_calls(snap) for _, snap in polls)


def test_healthy_zero3_and_fsdp_streams_say_nothing():
    zero = [Rank(0), Rank(1)]
    for step in range(1, 13):
        for r in zero:
            r.zero3_step(step)
    assert pairings_said(read(zero)) == []
    # FSDP: per unit, a forward all-gather, a backward all-gather (the same sizes) and a
    # reduce-scatter, issued from the forward's and the backward's lines
    fsdp = [Rank(r, world=4) for r in range(4)]
    units = [[4096], [4096], [1024], [4096]]
    for step in range(1, 9):
        for r in fsdp:
            for shape in units:
                r.call(site(60), step, ("all_gather_into_tensor", [shape]))
            for shape in reversed(units):
                r.call(site(61), step, ("all_gather_into_tensor", [shape]))
                r.call(site(61), step, ("reduce_scatter_tensor", [[shape[0] * 4]]))
            r.events.append(r._ev("step", step=step, step_time_s=0.1))
    assert pairings_said(read(fsdp, lead=9, lag=5)) == []


def test_a_pairing_whose_other_side_ended_is_decided_at_the_poll():
    """Rank 1 finishes right after the pairing (no two steps more): its sites are all known."""
    r0, r1 = Rank(0), Rank(1)
    for step in range(1, 5):
        for r in (r0, r1):
            r.zero3_step(step, gathers=4)
    r0.call(EVALUATE, 4)
    r1.call(FORWARD, 5)
    r1.events.append(r1._ev("exit", code=0, reason="normal"))
    found = pairings_said(read([r0, r1], lead=100, lag=0))
    assert len(found) == 1 and " at step 4," in found[0].summary


def call(seq: int, line: int, step: int = 1, group_ranks=None) -> CollectiveView:
    where = CallSite(f"t.py:{line} main", file="/w/t.py", line=line)
    return CollectiveView(
        "all_reduce", seq, 0.0, shapes=((10,),), dtypes=("float32",), site=where, step=step,
        group_ranks=group_ranks,
    )  # fmt: skip


def test_every_structure_is_bounded():
    log = PairingLog()
    for seq in range(1, 3 * MAX_OPEN):  # rank 1 never reports: its calls stay open
        log.on_call(0, call(seq, 10 + seq % 500), world=2)
    assert len(log._open) <= MAX_OPEN
    assert len(log._ranks[0].sites["default"]) <= 256 and "default" in log._ranks[0].full
    for seq in range(1, 500):  # every call pairs another site: pendings capped
        log.on_call(1, call(seq, 2000 + seq), world=2)
    assert len(list(log.pending())) <= 64
    done = PairingLog()
    for seq in range(1, 100):
        for rank in (0, 1):
            done.on_call(rank, call(seq, 10), world=2)
    assert not done._open  # forgotten once both members made it


def test_a_restarted_process_starts_the_numbers_over_without_a_pairing():
    log = PairingLog()
    log.on_call(0, call(1, 10), world=2)
    log.restart()
    log.on_call(1, call(1, 20), world=2)
    assert not list(log.pending())


JOIN_FILE = "torch/distributed/algorithms/join.py"


def join_job(*, through_join: bool) -> list[Any]:
    """recipe_join_uneven.py: under `with Join([model])` (line 36) rank 0 runs out of data after
    10 steps, rank 1 after 15. Each DDP forward (line 39) notifies Join with an all_reduce of
    [1] (Join.notify_join_context); rank 0, out of data, shadows rank 1's from Join.__exit__
    (its `with` line), and rank 1 reaches that line only at its own exit, after step 15."""

    def via(line: int, function: str) -> dict[str, Any]:
        if not through_join:
            return {}
        return {"via": {"file": JOIN_FILE, "line": line, "function": function}}

    notify, shadow = (
        site(39, **via(340, "Join.notify_join_context")),
        site(36, **via(265, "Join.__exit__")),
    )
    count = ("all_reduce", [[1]])
    r0, r1 = Rank(0), Rank(1)
    for step in range(1, 16):
        for r in (r0, r1):
            if r is r0 and step > 10:
                r.call(shadow, 10, count)
                continue
            r.call(notify, step, count)
            r.events.append(r._ev("step", step=step, step_time_s=0.05))
    r1.call(shadow, 15, count)  # rank 1's own Join exit
    return read([r0, r1], lead=1, lag=0, blind=False)


def test_joins_shadow_calls_are_no_pairing_however_the_polls_fall():
    """Join pairs rank 0's shadow with rank 1's notice by design: read a call at a time (a poll
    between rank 1's steps 12 and 15 decided it before rank 1's exit was read: a warning on a
    healthy job), no pairing is said; without Join's frames the same calls are one."""
    assert all(not pairings_said([poll]) for poll in join_job(through_join=True))
    assert pairings_said(join_job(through_join=False))
