"""What the views of one snapshot say together: whom each waiting rank waits on, and which ranks
were gone when the record of a finished run ended. (RunState.snapshot makes the views.)"""

from __future__ import annotations

import bisect
from dataclasses import replace

from ddpdoctor.monitor.model.snapshot import POINT_TO_POINT_OPS, CollectiveView, RankState, RankView
from ddpdoctor.protocol import events as ev
from ddpdoctor.protocol.torchrun_logs import signal_name

MAX_WAITING_ON = 16  # ranks listed as "waiting on" per rank


def settle_post_mortem(views: list[RankView]) -> list[RankView]:
    """The record has ended: a rank with no exit while every other rank ended is gone."""
    out = []
    for view in views:
        if not view.state.finished and view.state is not RankState.STARTING:
            others = [v for v in views if v.rank != view.rank]
            if others and all(v.state.finished for v in others):
                view = replace(
                    view,
                    state=RankState.GONE,
                    failed_t=view.last_event_t,
                    exit_signal=view.exit_signal or signal_name(view.exit_code),
                )
        out.append(view)
    return out


def fill_waiting_on(views: list[RankView]) -> list[RankView]:
    """For each rank waiting in a collective: the group members that have not reached it."""
    state = RankState.WAITING  # (looked up once: an enum's member costs a lookup each time)
    waiting = [v for v in views if v.state is state and v.collective is not None]
    if not waiting:
        return views
    world = list(range(len(views)))
    cache: dict[tuple[str, tuple[int, ...] | None], tuple[list[int], list[int]]] = {}
    for view in waiting:
        coll = view.collective
        assert coll is not None
        if coll.op in POINT_TO_POINT_OPS:
            continue
        members = coll.group_ranks if coll.group != ev.DEFAULT_GROUP else None
        key = (coll.group, members)
        if key not in cache:
            pairs = sorted(
                (views[m].seq_in(coll.group), m)
                for m in (members if members is not None else world)
                if 0 <= m < len(views)
            )
            cache[key] = ([p[0] for p in pairs], [p[1] for p in pairs])
        seqs, ranks = cache[key]
        behind = ranks[: bisect.bisect_left(seqs, coll.seq)][:MAX_WAITING_ON]
        if behind:
            views[view.rank] = replace(view, waiting_on=tuple(sorted(behind)))
    return views


def waiting_collective(view: RankView) -> CollectiveView | None:
    """The collective a rank waits in, ignoring point-to-point ops (their seqs do not compare)."""
    coll = view.collective
    if coll is None or coll.op in POINT_TO_POINT_OPS:
        return None
    return coll
