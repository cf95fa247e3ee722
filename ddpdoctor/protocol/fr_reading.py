"""One reading of the ranks' flight-recorder dumps, shared by the live diagnosis (the monitor's
fr_* rules and evidence) and the post-mortem (`ddpdoctor explain` of dump files).

Per process group: the first collective where the ranks diverge (different calls at one sequence
number, or calls some members never reached), the ranks that never reached it (those whose dumps
show fewer collectives scheduled, and members that left no dump), how far behind each rank is,
the op, sizes and dtypes on each side, and the Python frames the recorder kept, the user's first.

Calls at one sequence number are compared with torch's own analyzer
(torch.distributed.flight_recorder.components.types.Op.match, the comparison `fr_trace` makes).
Its whole pipeline (builder.build_db) cannot be used: it reads pickles from one folder by file
name prefix only (loader.read_dir; no JSON form, no ddpdoctor answers), asserts that every rank's
dump is there (a hung or dead rank often left none), may exit the process, and logs its report
rather than returning it; nor does it say who is behind by how much, or which frame is the
user's. So the grouping, ordering and missing-rank logic is here, and the per-call verdict is
torch's.

Group members: the default group's are pg_config's longest rank list (or the world size given).
gloo writes every group of pg_config under one empty name, so a subgroup's members are read as
the ranks whose dumps have that group, plus the ranks that left no dump at all (they may be
members; a rank whose dump lacks the group is not one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ddpdoctor.protocol.events import MAX_RANKS
from ddpdoctor.protocol.flight_recorder import FrEntry, FrRank

DEFAULT_PG = "0"
# torch's match states that mean the calls differ (a state difference is what a hang looks like)
_DIFFERENT = ("COLLECTIVE_TYPE_MISMATCH", "SIZE_OR_SYNTAX_MISMATCH", "COLLECTIVE_DTYPE_MISMATCH")
# where a frame is not the user's own code
_LIBRARY_MARKERS = ("site-packages/", "dist-packages/", "/lib/python", "<frozen ", "/torch/")


def same_call(a: FrEntry, b: FrEntry) -> bool:
    """The same op on the same tensors: what torch's analyzer matches in every case."""
    return (
        a.op == b.op
        and a.p2p == b.p2p
        and a.input_sizes == b.input_sizes
        and a.input_dtypes == b.input_dtypes
        and a.output_sizes == b.output_sizes
        and a.output_dtypes == b.output_dtypes
    )


def compare(a: FrEntry, b: FrEntry, ranks: Sequence[int]) -> str | None:
    """Why two calls at one sequence number differ, in torch's analyzer's words; None when they
    match. Without the analyzer (an old torch, an op it does not model) only the op is compared:
    sizes may legitimately differ between ranks (gather, scatter, all_to_all).

    Identical calls match without asking: the analyzer lives in torch, and importing torch in the
    monitor costs two seconds of CPU, which a healthy job's dumps (asked while its ranks start)
    would otherwise take from the ranks on a small machine."""
    if same_call(a, b):
        return None
    try:
        from torch.distributed.flight_recorder.components.types import Op

        members = {a.pg_name: set(ranks)}
        info = Op(a.torch_event(), members, a.pg_name).match(
            Op(b.torch_event(), members, a.pg_name)
        )
    except Exception:  # noqa: BLE001 - no analyzer, or an op it does not know
        return f"COLLECTIVE_TYPE_MISMATCH: {a.op} vs {b.op}" if a.op != b.op else None
    state = getattr(info.state, "name", "")
    return f"{state}: {info.culprit}" if state in _DIFFERENT else None


def calls_at_first_difference(
    dumps: Sequence[FrRank], world_size: int | None = None, pg: str = DEFAULT_PG
) -> tuple[int, dict[int, FrEntry], str] | None:
    """The first sequence number of group `pg` where the ranks' backends recorded different
    calls: (seq, each rank's call, torch's analyzer's reason); None when every number matches.
    `world_size`: the default group's size (torch's analyzer checks gather sizes against it)."""
    usable = [d for d in dumps if d.error is None]
    if len(usable) < 2:
        return None
    ranks = list(range(world_size)) if world_size else sorted({d.rank for d in usable})
    seqs = sorted({e.seq for d in usable for e in d.entries if e.pg == pg and not e.p2p})
    for seq in seqs:
        calls = {d.rank: e for d in usable if (e := d.entry(pg, seq)) is not None}
        if len(calls) < 2:
            continue
        first = next(iter(calls.values()))
        for entry in list(calls.values())[1:]:
            why = compare(first, entry, ranks)
            if why is not None:
                return seq, calls, why
    return None


def user_first(frames: Sequence[tuple[str, int, str]]) -> list[str]:
    """ "file:line function" for each frame, the user's own (innermost first) before torch's and
    other libraries': the line a fix changes leads."""
    mine = [f for f in frames if not any(m in f[0] for m in _LIBRARY_MARKERS)]
    theirs = [f for f in frames if f not in mine]
    return [f"{file}:{line} {name}" for file, line, name in [*mine, *theirs]]


@dataclass(frozen=True)
class RankPosition:
    """Where one member of a group is, from its dump."""

    rank: int
    last_scheduled: int
    last_completed: int
    pending: FrEntry | None  # its oldest call not completed
    waited_s: float | None  # how long `pending` had waited when the dump was taken
    behind: int  # collectives scheduled by the furthest member and not by this one


@dataclass(frozen=True)
class GroupReading:
    """What the dumps say about one process group."""

    pg: str
    name: str
    desc: str
    members: tuple[int, ...]  # known members and ranks that may be members (left no dump)
    positions: tuple[RankPosition, ...]  # the members with a dump
    no_dump: tuple[int, ...]  # members (or possible members) that left no dump
    # "mismatch" | "never_reached" | "no_dump" (no call pending, but members left no dump: the
    # furthest call recorded is `seq`) | "consistent"
    kind: str
    seq: int | None = None  # the first collective where the ranks diverge
    calls: dict[int, FrEntry] = field(default_factory=dict)  # each rank's call at `seq`
    never_reached: tuple[int, ...] = ()  # members that did not schedule `seq` (no_dump included)
    why: str | None = None  # torch's analyzer's reason, for a mismatch

    @property
    def label(self) -> str:
        return "the default group" if self.pg == DEFAULT_PG else f"group {self.desc or self.name}"

    def position(self, rank: int) -> RankPosition | None:
        return next((p for p in self.positions if p.rank == rank), None)

    @property
    def waiting(self) -> tuple[RankPosition, ...]:
        """Members with the divergent call scheduled and not completed."""
        return tuple(
            p for p in self.positions if p.pending is not None and p.pending.seq == self.seq
        )


def read_groups(dumps: Sequence[FrRank], world_size: int | None = None) -> list[GroupReading]:
    """Every group the dumps record, the ones that diverge first (root causes before the groups
    whose laggards are themselves waiting elsewhere), then the consistent ones."""
    usable = [d for d in dumps if d.error is None]
    world = _world(usable, world_size)
    dumped = {d.rank for d in usable}
    pgs = sorted(
        {g.pg for d in usable for g in d.groups} | {e.pg for d in usable for e in d.entries},
        key=lambda pg: (len(pg), pg),
    )
    readings = [_read_group(pg, usable, world, dumped) for pg in pgs]
    waiting_elsewhere = {
        (r.pg, p.rank) for r in readings for p in r.positions if p.pending is not None
    }

    def order(r: GroupReading) -> tuple:
        victims = all(
            any((pg, rank) in waiting_elsewhere for pg in pgs if pg != r.pg)
            for rank in r.never_reached
        )
        created = min((p.pending.created_t or 0.0 for p in r.waiting if p.pending), default=0.0)
        kind = {"mismatch": 0, "never_reached": 1, "no_dump": 2, "consistent": 3}[r.kind]
        return (kind, victims and r.kind == "never_reached", created, r.pg)

    return sorted(readings, key=order)


def _world(dumps: Sequence[FrRank], world_size: int | None) -> tuple[int, ...]:
    """The default group's ranks: 0..world_size-1 when known, else every rank up to the highest
    one a dump or pg_config names. Rank numbers from files stay sparse: past MAX_RANKS (a dump
    named fr_trace_rank_50000000) the world is only the ranks named, never a range built to
    the largest number a file made up."""
    if world_size and 0 < world_size <= MAX_RANKS:
        return tuple(range(world_size))
    known = max((d.world for d in dumps), key=len, default=())
    named = {*known, *(d.rank for d in dumps)}
    top = max(named, default=-1)
    if top < MAX_RANKS:
        return tuple(range(top + 1))
    return tuple(sorted(named))


def _read_group(
    pg: str, dumps: Sequence[FrRank], world: tuple[int, ...], dumped: set[int]
) -> GroupReading:
    have = [d for d in dumps if d.group(pg) is not None or any(e.pg == pg for e in d.entries)]
    no_dump = tuple(r for r in world if r not in dumped)
    members = tuple(sorted({d.rank for d in have} | set(no_dump)))
    entry = next((e for d in have for e in d.entries if e.pg == pg), None)
    name, desc = (entry.pg_name, entry.pg_desc) if entry else (pg, "")
    scheduled = {d.rank: last_scheduled(d, pg) for d in have}
    furthest = max(scheduled.values(), default=0)
    positions = tuple(
        RankPosition(
            rank=d.rank,
            last_scheduled=scheduled[d.rank],
            last_completed=_last_completed(d, pg),
            pending=(pending := d.pending(pg)),
            waited_s=(
                d.taken_t - pending.created_t
                if pending is not None and pending.created_t is not None and d.taken_t > 0
                else None
            ),
            behind=furthest - scheduled[d.rank],
        )
        for d in sorted(have, key=lambda d: d.rank)
    )
    base = GroupReading(pg, name, desc, members, positions, no_dump, "consistent")
    found = calls_at_first_difference(have, len(world) if pg == DEFAULT_PG else None, pg)
    waiting = [p.pending.seq for p in positions if p.pending is not None]
    # the lowest call someone waits in that some member never scheduled
    hang_seq = next(
        (k for k in sorted(set(waiting)) if no_dump or any(s < k for s in scheduled.values())),
        None,
    )
    if found is not None and (hang_seq is None or found[0] <= hang_seq):
        seq, calls, why = found
        return _with(base, "mismatch", seq, calls, why, scheduled)
    if hang_seq is not None:
        calls = {d.rank: e for d in have if (e := d.entry(pg, hang_seq)) is not None}
        return _with(base, "never_reached", hang_seq, calls, None, scheduled)
    if no_dump and furthest > 0:
        # gloo records a call that failed (its peer gone) as finished: the furthest call is all
        # the dumps can say about where the ranks without a dump were left behind
        calls = {d.rank: e for d in have if (e := d.entry(pg, furthest)) is not None}
        return _with(base, "no_dump", furthest, calls, None, scheduled)
    return base


def _with(
    base: GroupReading,
    kind: str,
    seq: int,
    calls: dict[int, FrEntry],
    why: str | None,
    scheduled: dict[int, int],
) -> GroupReading:
    never = tuple(sorted({r for r, s in scheduled.items() if s < seq} | set(base.no_dump)))
    return replace(base, kind=kind, seq=seq, calls=calls, never_reached=never, why=why)


def last_scheduled(d: FrRank, pg: str) -> int:
    """The group's last collective this rank's backend scheduled: how far it got (0: none)."""
    group = d.group(pg)
    seqs = [e.seq for e in d.entries if e.pg == pg and not e.p2p]
    return max([group.last_enqueued if group else 0, *seqs])


def _last_completed(d: FrRank, pg: str) -> int:
    group = d.group(pg)
    done = [e.seq for e in d.entries if e.pg == pg and not e.p2p and d.state_of(e) == "completed"]
    return max([group.last_completed if group else 0, *done])
