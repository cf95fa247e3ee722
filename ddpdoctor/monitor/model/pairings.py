"""Calls paired by chance, found as the monitor reads every rank's collective_start.

Under ZeRO-3 or FSDP an evaluation on rank 0 alone gathers parameters with all-gathers the other
ranks never make; the transport pairs them with the others' training all-gathers of the same
size. Comparing the ranks' latest calls at each poll (a window of RankTracker.recent) finds that
only when a poll lands while the pairing is in every rank's window: a ZeRO-3 step of a real model
makes dozens of all-gathers, and the pairing has slid out by the next poll. So every call is
compared here, as it is read, with the other ranks' call of the same (group, sequence number).

Two calls of one (group, seq) from different sites, of the same op, shapes and dtypes, are a
pairing to look at, not yet one to report: healthy code reaches one collective from two lines
(`if rank == 0: x at line A`, `else: x at line B`), or reaches a site on one rank a step before
the other. The test is call_sites._is_extra's: one side (x) called from a site the other (y)
never calls from, while x calls from y's site too. "Never" can only be said once y has gone on:
the pairing is decided when y's calls are stamped two steps past its paired call (CALLS_AFTER
calls when its runtime stamps no steps), or y has ended; until then it waits (bounded).

Bounded throughout: an open (group, seq) is forgotten once every member of the group made it
(MAX_OPEN at most), each rank's sites per group are capped (a rank whose sites overflow is no
longer said to "never" call from a site), and at most MAX_PENDING pairings wait, MAX_FOUND found.
Only the ranks whose events this monitor reads are fed (one node's); ranks of other nodes are
compared by the rule over their summaries' latest calls, as before (rules/chance_pairing.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ddpdoctor.monitor.model.snapshot import POINT_TO_POINT_OPS, CollectiveView
from ddpdoctor.protocol.events import JOIN_FILE

SiteKey = tuple[str, str, str]

MAX_OPEN = 4096  # (group, seq) entries some member has not made yet
MAX_SITES = 256  # site keys kept per rank and group
MAX_GROUPS = 64  # groups followed per rank
MAX_PENDING = 64  # pairings waiting to be decided (the oldest goes first)
MAX_FOUND = 8  # pairings found (diagnose keeps at most 8 said)
_JOIN_VIA = JOIN_FILE + ":"  # a site's via through torch's Join: paired by design
STEPS_AFTER = 2  # a pairing is decided once the other side's calls are stamped this many steps on
CALLS_AFTER = 64  # ... or, unstamped, once it made this many more calls in the group


class _Record(Protocol):
    """What `view` reads of a rank's record (RankTracker)."""

    exit_code: int | None


def through_join(call: CollectiveView) -> bool:
    """Whether torch's Join made the call (a shadow of the others', or its notice to them)."""
    return call.site is not None and call.site.via.startswith(_JOIN_VIA)


@dataclass(frozen=True)
class Pairing:
    """`culprits` made `call` (#seq of `group`) from a site `others` never call from, and the
    transport paired it with the others' `other_call` of the same op, shapes and dtypes. Both
    calls keep their site, signature and the step their runtime stamped."""

    group: str
    seq: int
    culprits: tuple[int, ...]
    call: CollectiveView
    others: tuple[int, ...]
    other_call: CollectiveView


@dataclass(frozen=True)
class PairingsView:
    """What a snapshot carries: the pairings found, and the ranks whose every call was compared
    (the rule compares the others' latest calls itself)."""

    found: tuple[Pairing, ...] = ()
    fed: frozenset[int] = frozenset()


@dataclass(slots=True)
class _Rank:
    sites: dict[str, set[SiteKey]] = field(default_factory=dict)
    full: set[str] = field(default_factory=set)  # groups whose sites overflowed MAX_SITES
    calls: dict[str, int] = field(default_factory=dict)  # calls made, per group
    step: int | None = None  # the latest step its calls were stamped with
    last: tuple[str, int] | None = None  # the (group, seq) fed last (fed once each)


@dataclass(slots=True)
class _Open:
    rank: int  # the first rank that made this (group, seq) from a known site (else the first)
    call: CollectiveView  # ... its call
    where: SiteKey | None  # ... its site (None: no call of it had a site yet)
    made: int  # how many ranks made it
    need: int  # the group's size (0: unknown, forgotten at MAX_OPEN only)


@dataclass(slots=True)
class _Pending:
    call_a: CollectiveView
    a: int
    call_b: CollectiveView
    b: int
    a_from: int  # each side's calls in the group when the pairing was read
    b_from: int


class PairingLog:
    """Fed every non point-to-point call of the ranks this monitor reads (RunState.apply)."""

    def __init__(self) -> None:
        self._ranks: dict[int, _Rank] = {}
        self._open: dict[tuple[str, int], _Open] = {}
        self._pending: list[_Pending] = []
        self._found: list[Pairing] = []
        # (group, rank) -> [site, seq]: a rank's run of calls from the site of a pairing found,
        # up to the latest read: one evaluation's calls are one pairing, however they were read
        self._runs: dict[tuple[str, int], list[Any]] = {}
        self._view: PairingsView | None = PairingsView()

    def restart(self) -> None:
        """A rank's process was replaced or its events are read again: sequence numbers start
        over, so what was open is forgotten (the pairings found stay: they happened)."""
        self._ranks.clear()
        self._open.clear()
        self._pending.clear()
        self._runs.clear()
        self._view = None

    def forget(self, rank: int) -> None:
        """A rank refused (no process of the job behind it): nothing of its saying stays."""
        self.restart()
        self._found = [p for p in self._found if rank not in p.culprits + p.others]

    def on_call(self, rank: int, call: CollectiveView, world: int | None) -> None:
        """One call of a rank, as its collective_start is read (every call of every rank this
        monitor reads: kept to a few dict and set operations when nothing differs)."""
        if call.op in POINT_TO_POINT_OPS:
            return
        me = self._ranks.get(rank)
        if me is None:
            me = self._ranks[rank] = _Rank()
            self._view = None
        group = call.group
        key = (group, call.seq)
        if me.last == key:
            return  # the same call again (a start that added no call of its own)
        me.last = key
        made = me.calls.get(group)
        if made is None:
            if len(me.calls) >= MAX_GROUPS:
                return
            made = 0
        me.calls[group] = made + 1
        step = call.step
        if step is not None and (me.step is None or step > me.step):
            me.step = step
        site = call.site
        where = site.key if site is not None else None
        if where is not None:
            sites = me.sites.get(group)
            if sites is None:
                sites = me.sites[group] = set()
            if where not in sites:
                if len(sites) < MAX_SITES:
                    sites.add(where)
                else:
                    me.full.add(group)
        run = self._runs.get((group, rank)) if self._runs and where is not None else None
        if run is not None:
            if run[0] == where:
                run[1] = call.seq  # the run of calls from a pairing's site goes on
            else:
                del self._runs[(group, rank)]
        entry = self._open.get(key)
        if entry is None:
            if len(self._open) >= MAX_OPEN:
                del self._open[next(iter(self._open))]
            need = len(call.group_ranks) if call.group_ranks else (world or 0)
            self._open[key] = _Open(rank, call, where, 1, need)
        else:
            entry.made += 1
            if entry.made == entry.need:
                del self._open[key]  # every member made it: no call of it is still to come
            if where is None or where == entry.where:
                pass
            elif entry.where is None:
                entry.rank, entry.call, entry.where = rank, call, where
            elif (
                call.shapes
                and call.signature() == entry.call.signature()
                and not (through_join(call) or through_join(entry.call))
            ):
                # another site, the same op and size: which side made an extra call, if one
                self._pend(entry.rank, entry.call, rank, call)
        if self._pending:
            self._settle(_never, rank)

    def view(self, ranks: Mapping[int, _Record]) -> PairingsView:
        """The pairings found so far, after deciding those whose other side has ended (its
        record has an exit: every site it called from is known)."""
        if self._pending:
            self._settle(lambda r: r in ranks and ranks[r].exit_code is not None)
        if self._view is None:
            self._view = PairingsView(tuple(self._found), frozenset(self._ranks))
        return self._view

    # -- deciding ----------------------------------------------------------------------------

    def _pend(self, a: int, call_a: CollectiveView, b: int, call_b: CollectiveView) -> None:
        assert call_a.site is not None and call_b.site is not None
        for rank, seq, where in (
            (a, call_a.seq, call_a.site.key),
            (b, call_b.seq, call_b.site.key),
        ):
            run = self._runs.get((call_a.group, rank))
            if run is not None and run[0] == where and seq <= run[1]:
                return  # a later call of a pairing found (the rest of one evaluation)
        sides = {(a, call_a.site.key), (b, call_b.site.key)}
        for p in self._pending:  # an earlier call of the same two sites is waiting already
            if p.call_a.group == call_a.group and sides == _sides(p):
                return
        if len(self._pending) >= MAX_PENDING:
            del self._pending[0]
        group = call_a.group
        a_from, b_from = self._ranks[a].calls.get(group, 0), self._ranks[b].calls[group]
        self._pending.append(_Pending(call_a, a, call_b, b, a_from, b_from))

    def _settle(self, ended: Callable[[int], bool], rank: int | None = None) -> None:
        kept: list[_Pending] = []
        for p in self._pending:
            if rank is not None and rank not in (p.a, p.b):
                kept.append(p)
                continue
            extra = self._decide(p, ended)
            if extra is None:
                kept.append(p)
            elif extra == p.a:
                self._note(p.a, p.call_a, p.b, p.call_b)
            elif extra == p.b:
                self._note(p.b, p.call_b, p.a, p.call_a)
        self._pending = kept

    def _decide(self, p: _Pending, ended: Callable[[int], bool]) -> int | None:
        """The rank whose call was extra (found), -1 when neither's was (dropped), None: wait."""
        group = p.call_a.group
        a, b = self._ranks.get(p.a), self._ranks.get(p.b)
        if a is None or b is None:
            return -1
        assert p.call_a.site is not None and p.call_b.site is not None
        key_a, key_b = p.call_a.site.key, p.call_b.site.key
        sites_a, sites_b = a.sites.get(group, set()), b.sites.get(group, set())
        if key_a in sites_b and key_b in sites_a:
            return -1  # each calls from the other's site: the same collective, two lines
        past_a = ended(p.a) or _past(a, group, p.call_a, p.a_from)
        past_b = ended(p.b) or _past(b, group, p.call_b, p.b_from)
        # a's call is extra: b never calls from a's site (said once b has gone on), while a
        # calls from b's site too; and the same the other way round
        if key_b in sites_a and key_a not in sites_b and past_b and group not in b.full:
            return p.a
        if key_a in sites_b and key_b not in sites_a and past_a and group not in a.full:
            return p.b
        return -1 if past_a and past_b else None

    def _note(self, x: int, call: CollectiveView, y: int, other: CollectiveView) -> None:
        """Keep the pairing found: rank x's call, with the other ranks it was paired with."""
        assert call.site is not None
        run = self._runs.get((call.group, x))
        if run is None and len(self._runs) < MAX_PENDING:
            self._runs[(call.group, x)] = [call.site.key, call.seq]
        elif run is not None and run[0] == call.site.key:
            run[1] = max(run[1], call.seq)
        for i, known in enumerate(self._found):
            if (known.group, known.seq) == (call.group, call.seq) and known.call.site == call.site:
                if x in known.culprits and y in known.others:
                    return
                culprits, others = {*known.culprits, x}, {*known.others, y}
                self._found[i] = replace(
                    known, culprits=tuple(sorted(culprits)), others=tuple(sorted(others))
                )
                self._view = None
                return
        if len(self._found) < MAX_FOUND:
            self._found.append(Pairing(call.group, call.seq, (x,), call, (y,), other))
            self._view = None

    def pending(self) -> Iterator[tuple[int, int]]:
        """(rank, rank) of the pairings waiting to be decided (for tests and debugging)."""
        return ((p.a, p.b) for p in self._pending)


def _never(rank: int) -> bool:
    return False


def _sides(p: _Pending) -> set[tuple[int, SiteKey]]:
    assert p.call_a.site is not None and p.call_b.site is not None
    return {(p.a, p.call_a.site.key), (p.b, p.call_b.site.key)}


def _past(rank: _Rank, group: str, call: CollectiveView, calls_then: int) -> bool:
    """Whether the rank has gone far enough on since `call` that a site it has not called
    from by now is one it never calls from: two steps on by its calls' stamps, or CALLS_AFTER
    calls when its runtime stamps none."""
    if call.step is not None and rank.step is not None:
        return rank.step >= call.step + STEPS_AFTER
    return rank.calls.get(group, 0) - calls_then >= CALLS_AFTER
