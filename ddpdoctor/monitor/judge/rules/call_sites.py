"""The first collective whose call sites differ between ranks: where a rank-conditional collective
began, even where the transport did not notice.

gloo pairs any barrier with any barrier: a `strategy.barrier()` that only rank 0 makes pairs with
the next barrier Lightning makes on rank 1, and the ranks only disagree visibly a call later (or
hang there), where the rule comparing ops and shapes would blame whichever side looks odd *then*.
Each explicit collective's event says where it was called from (the user's line, the framework
function it went through: ddpdoctor/runtime/call_sites.py), so the ranks' sequences can be lined
up: the rank whose call at #K comes from a site the others never called from, while the others'
call at #K is one it makes too (before or after), made one call too many, there.

Sites alone never make a verdict: healthy code may call the same collective from different lines
on different ranks (`if rank == 0: dist.barrier()` after a download, `else: dist.barrier()`
before it). Such a pair is no insertion (neither side ever calls from the other's line) and is
passed over. The mismatch and hang rules ask this module only once they have found a problem.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ddpdoctor.findings import Evidence
from ddpdoctor.monitor.model.snapshot import POINT_TO_POINT_OPS, CollectiveView, RankView, Snapshot
from ddpdoctor.rank_ranges import named_ranks

SiteKey = tuple[str, str, str]


@dataclass(frozen=True)
class Divergence:
    """Ranks `culprits` made `call` (#seq of `group`) from a site the `others` never called from."""

    group: str
    seq: int
    culprits: tuple[int, ...]
    call: CollectiveView
    others: tuple[int, ...]
    other_call: CollectiveView | None  # what the others called at #seq (None: nothing yet)
    others_ended: bool = False  # the others finished before ever reaching #seq
    others_doing: str = ""  # what the others are in instead ("all_reduce (float32[18])")

    def describe(self) -> str:
        """ "rank 0 called barrier #16 from lit.py:24 on_epoch_end via DDPStrategy.barrier; rank
        1 never did (its #16: barrier from lit.py:40 main via Trainer.fit > _sync_ddp)" """
        assert self.call.site is not None
        text = (
            f"{named_ranks(list(self.culprits))} called {self.call.op} #{self.seq}"
            f" from {self.call.site.describe()}; {named_ranks(list(self.others))} never did"
        )
        other = self.other_call
        if other is not None and other.site is not None:
            text += f" (its #{other.seq}: {other.op} from {other.site.describe()})"
        elif self.others_ended:
            text += f" (it finished after #{self.seq - 1})"
        elif self.others_doing:
            text += f" (it is in {self.others_doing})"
        return text

    def evidence(self) -> tuple[Evidence, ...]:
        site = self.call.site
        assert site is not None
        first = self.culprits[0]
        out = [
            Evidence(
                f"rank {first} called {self.call.describe()} from {site.describe()}",
                site.file or None,
                site.line,
            )
        ]
        if site.caller:
            out.append(
                Evidence(
                    f"rank {first}: {site.user.partition(' ')[2] or site.user} was called from "
                    f"{site.caller}",
                    site.caller_file or None,
                    site.caller_line,
                )
            )
        if site.via:
            out.append(Evidence(f"rank {first}: {site.via}" + _issuer(site.via, site.issuer)))
        return tuple(out)


def _issuer(via: str, issuer: str) -> str:
    return f" > {issuer}" if issuer and issuer != via else ""


def _calls_by_group(view: RankView) -> dict[str, dict[int, CollectiveView]]:
    out: dict[str, dict[int, CollectiveView]] = defaultdict(dict)
    calls = list(view.recent_collectives)
    if view.collective is not None:
        calls.append(view.collective)
    for coll in calls:
        if coll.op not in POINT_TO_POINT_OPS and coll.site is not None:
            out[coll.group][coll.seq] = coll
    return out


def first_divergence(snap: Snapshot) -> Divergence | None:
    """The earliest #K (any group) where one side of the ranks made an extra call, or None."""
    per_rank = {view.rank: _calls_by_group(view) for view in snap.ranks}
    groups = {group for calls in per_rank.values() for group in calls}
    found: Divergence | None = None
    for group in sorted(groups):
        calls = {rank: by[group] for rank, by in per_rank.items() if by.get(group)}
        divergence = _in_group(group, calls)
        if divergence is not None and (found is None or divergence.seq < found.seq):
            found = divergence
    return found


def _in_group(group: str, calls: dict[int, dict[int, CollectiveView]]) -> Divergence | None:
    if len(calls) < 2:
        return None
    sites: dict[int, set[SiteKey]] = {
        rank: {c.site.key for c in by_seq.values() if c.site is not None}
        for rank, by_seq in calls.items()
    }
    start = max(min(by_seq) for by_seq in calls.values())  # every window covers #start on
    seqs = sorted({seq for by_seq in calls.values() for seq in by_seq if seq >= start})
    for seq in seqs:
        sides: dict[SiteKey, list[int]] = defaultdict(list)
        for rank, by_seq in calls.items():
            coll = by_seq.get(seq)
            if coll is not None and coll.site is not None:
                sides[coll.site.key].append(rank)
        if len(sides) < 2:
            continue
        extra = [key for key, ranks in sides.items() if _is_extra(key, ranks, sides, sites)]
        if len(extra) != 1:
            continue  # the same collective from different lines, or no telling: pass over
        culprits = sorted(sides[extra[0]])
        others = sorted(r for key, ranks in sides.items() if key != extra[0] for r in ranks)
        return Divergence(
            group,
            seq,
            tuple(culprits),
            calls[culprits[0]][seq],
            tuple(others),
            calls[others[0]][seq],
        )
    return None


def _is_extra(
    key: SiteKey,
    ranks: list[int],
    sides: dict[SiteKey, list[int]],
    sites: dict[int, set[SiteKey]],
) -> bool:
    """Whether the side calling from `key` made an extra call: no rank of another side ever
    called from there, and every other side's site is one this side calls from as well."""
    mine = set(ranks)
    for other_key, other_ranks in sides.items():
        if other_key == key:
            continue
        if any(key in sites[r] for r in other_ranks):
            return False
        if not all(other_key in sites[r] for r in mine):
            return False
    return True


def extra_before_end(coll: CollectiveView, ended: list[RankView]) -> bool:
    """Whether `coll` (a call the waiting ranks are in) comes from a site the ranks that ended
    cleanly before it never called from, while they did record call sites: an extra call of
    the waiting side (`if rank == 0: barrier()` at the end of training), not ranks that quit."""
    if coll.site is None or not ended:
        return False
    for view in ended:
        if view.exit_code != 0:
            return False
        by_group = _calls_by_group(view).get(coll.group)
        if not by_group or any(c.site and c.site.key == coll.site.key for c in by_group.values()):
            return False
    return True


def ended_divergence(
    waiters: list[RankView], coll: CollectiveView, ended: list[RankView]
) -> Divergence | None:
    """The Divergence for waiters in `coll` whose peers ended cleanly without ever making it."""
    if not extra_before_end(coll, ended):
        return None
    return Divergence(
        coll.group,
        coll.seq,
        tuple(sorted(v.rank for v in waiters)),
        coll,
        tuple(sorted(v.rank for v in ended)),
        None,
        others_ended=True,
    )


def open_extra(
    snap: Snapshot, side: list[int], others: list[int], doing: str = ""
) -> Divergence | None:
    """Whether the ranks of `side`, known to be in another call than `others` (the flight
    recorder says so), are all in an explicit collective from a site no other rank ever called
    from: `self.log(..., sync_dist=True)` under `if self.global_rank == 0` against the others'
    gradient all-reduce (DDP's, which has no site). `doing` says what the others are in."""
    views = [snap.rank(r) for r in side]
    first = views[0].collective if views and views[0] is not None else None
    if first is None or first.site is None or not others:
        return None
    key = first.site.key
    for view in views:
        coll = view.collective if view is not None else None
        if coll is None or coll.site is None or coll.site.key != key:
            return None
    other_views = [snap.rank(r) for r in others]
    if any(view is None or key in _site_keys(view) for view in other_views):
        return None
    other = other_views[0]
    return Divergence(
        first.group,
        first.seq,
        tuple(sorted(side)),
        first,
        tuple(sorted(others)),
        other.collective if other is not None else None,
        others_doing=doing,
    )


def _site_keys(view: RankView) -> set[SiteKey]:
    return {c.site.key for by in _calls_by_group(view).values() for c in by.values() if c.site}
