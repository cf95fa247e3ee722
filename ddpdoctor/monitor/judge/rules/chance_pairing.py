"""chance_pairing: a collective that only some ranks make, paired by the transport with another
rank's different collective of the same op and size.

Under ZeRO-3 or FSDP an evaluation or `generate()` on rank 0 alone gathers parameters: all-gathers
the other ranks never make. When the others are in all-gathers of the same size at that moment
(their training forward), the transport pairs them and nothing fails; the ranks are out of step
from then on, and the job hangs or mixes up tensors later, at a call that has nothing to do with
the cause. The call sites tell it when it happens: at #K one side called from a site the others
never called from, while the others' #K is a call the first side makes too. When the two calls
have the same op, shapes and dtypes, that is a chance pairing: a warning naming both sites and the
step the call was made in (as the runtime stamped it: the rank may be steps further by the time
the rule sees it), never a verdict (healthy code can reach the same collective from two lines;
the warning says what to check).

The ranks whose events this monitor reads had every call compared as it was read
(model/pairings.py: a ZeRO-3 step makes dozens of all-gathers, so a pairing is gone from the ranks'
latest calls by the next poll); the rule reports what that found. Ranks it did not read (other
nodes', known from their summaries) are compared over their latest calls at the poll
(call_sites.first_divergence), which sees a pairing only while it is among them.
"""

from __future__ import annotations

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, call_sites
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.pairings import PairingsView, through_join
from ddpdoctor.monitor.model.snapshot import POINT_TO_POINT_OPS, RankView, Snapshot
from ddpdoctor.rank_ranges import named_ranks

CODE = "collective.chance_pairing"
FIX = (
    "A collective that only some ranks reach (an evaluation, `generate()` or a checkpoint under "
    "`if rank == 0:` with ZeRO-3 / FSDP, whose forward gathers parameters) was paired with "
    "another rank's collective of the same size: the ranks are out of step from here on. Run "
    "that code on every rank (shard the evaluation with a DistributedSampler), or gather the "
    "full parameters first (ZeRO-3: `deepspeed.zero.GatheredParameters`; FSDP: "
    "`full_state_dict`) and compute on rank 0 without collectives."
)


def detect(snap: Snapshot) -> RuleOutcome | None:
    """The pairings the monitor found as it read the calls (model/pairings.py), and a pairing in
    the latest calls of ranks whose calls it did not read (other nodes': their summaries)."""
    findings: list[Finding] = []
    said: set[tuple[object, object]] = set()
    pairings: PairingsView | None = snap.pairings
    for found in pairings.found if pairings is not None else ():
        divergence = call_sites.Divergence(
            found.group, found.seq, found.culprits, found.call, found.others, found.other_call
        )
        findings.append(_finding(snap, divergence))
        said.add(_sites(divergence))
    if pairings is None or _unfed_calls(snap, pairings.fed):
        latest = _in_latest_calls(snap)
        if latest is not None and _sites(latest) not in said:
            findings.append(_finding(snap, latest))
    return RuleOutcome(rule="chance_pairing", findings=tuple(findings)) if findings else None


def _unfed_calls(snap: Snapshot, fed: frozenset[int]) -> bool:
    """Whether the snapshot holds the latest calls of a rank whose calls were not fed."""
    index = rank_index.of(snap)
    if index.narrow:
        return not fed.issuperset(index.ranks_with_calls)
    return any(view.recent_collectives and view.rank not in fed for view in snap.ranks)


def _sites(divergence: call_sites.Divergence) -> tuple[object, object]:
    other = divergence.other_call
    return (
        divergence.call.site.key if divergence.call.site else None,
        other.site.key if other is not None and other.site is not None else None,
    )


def _site_sequence(view: RankView) -> tuple[object, ...]:
    return tuple(
        (c.group, c.seq, c.site.key if c.site is not None else None)
        for c in view.recent_collectives
        if c.op not in POINT_TO_POINT_OPS
    )


def _in_latest_calls(snap: Snapshot) -> call_sites.Divergence | None:
    """A pairing in the ranks' latest calls (RankView.recent_collectives), as a poll sees them."""
    # one rank per distinct sequence of (call, site): ranks in step share one (a cheap check)
    classes: dict[tuple[object, ...], RankView] = {}
    for view in rank_index.of(snap).with_calls:
        if view.recent_collectives and not view.state.finished:
            classes.setdefault(_site_sequence(view), view)
    if len(classes) < 2:
        return None
    sample = Snapshot(
        run=snap.run, taken_t=snap.taken_t, ranks=tuple(classes.values()), thresholds=None
    )
    divergence = call_sites.first_divergence(sample)
    if divergence is None or divergence.other_call is None:
        return None
    call, other = divergence.call, divergence.other_call
    if call.signature() != other.signature() or not call.shapes:
        return None  # another op or size: the mismatch rule's, not a silent pairing
    if through_join(call) or through_join(other):
        return None  # torch's Join pairs them by design
    return divergence


def _finding(snap: Snapshot, divergence: call_sites.Divergence) -> Finding:
    call, other = divergence.call, divergence.other_call
    assert other is not None
    culprit = snap.rank(divergence.culprits[0])
    made_in = call.step if call.step is not None else culprit.step if culprit is not None else None
    step = f" at step {made_in}" if made_in is not None else ""
    assert call.site is not None and other.site is not None
    summary = (
        f"{named_ranks(list(divergence.culprits))} called {call.describe()} from "
        f"{call.site.describe()}{step}, which {named_ranks(list(divergence.others))} never "
        f"call; it was paired by chance with their {other.op} #{other.seq} of the same size "
        f"from {other.site.describe()}: the ranks are out of step from here on"
    )
    evidence = (
        *divergence.evidence(),
        Evidence(
            f"rank {divergence.others[0]} called {other.describe()} from {other.site.describe()}",
            other.site.file or None,
            other.site.line,
        ),
    )
    return Finding(
        id=CODE,
        severity=Severity.WARNING,
        summary=summary,
        fix=FIX,
        ranks=divergence.culprits,
        evidence=evidence,
    )
