"""A world size no launch can fill: `init_process_group(world_size=3)` in a job of 2 ranks.

Every rank then waits in the rendezvous for ranks that will never come (torch's store times out
after 10 to 30 minutes). The runtime records the world size the script asked for, before
init_process_group blocks (warning event `init.world_size_mismatch`, field `requested_world_size`,
next to the launch's `world_size`); once a rank has waited in it past WAIT_S with nothing
else happening, the verdict is MISMATCH (finding id `init.world_size_mismatch`): certain, since
the launcher started fewer processes than the world the script asked for.
"""

from __future__ import annotations

import re

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, fmt_s
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.snapshot import Snapshot, Verdict

CODE = "init.world_size_mismatch"
WAIT_S = 10.0  # a rendezvous of local ranks completes in well under a second
_SIZES = re.compile(r"world_size=(\d+).*?(\d+) ranks")


def detect(snap: Snapshot) -> RuleOutcome | None:
    waiting = []
    for view in rank_index.of(snap).with_warnings:
        if not view.warnings:
            continue
        message = dict(view.warnings).get(CODE)
        if message is None or view.collectives_done or view.step:
            continue
        # A rank stopped after the wait (by ddpdoctor, on this verdict) still waited that long.
        since = view.last_progress_t
        until = view.failed_t if view.state.finished and view.failed_t else snap.taken_t
        if since is None or until - since < WAIT_S:
            continue
        waiting.append((view.rank, message, since))
    if not waiting:
        return None
    _, message, since = waiting[0]
    sizes = _SIZES.search(message)
    asked, launched = (sizes.group(1), sizes.group(2)) if sizes else ("?", "?")
    summary = (
        f"waiting for ranks that will never come: world_size={asked} but {launched} ranks "
        f"launched (waiting in init_process_group for {fmt_s(snap.taken_t - since)})"
    )
    finding = Finding(
        id=CODE,
        severity=Severity.ERROR,
        summary=summary,
        fix=f"Drop world_size= (and rank=) from init_process_group: the launcher sets WORLD_SIZE "
        f"and RANK, which init_method='env://' reads; or launch {asked} ranks (--nproc).",
        ranks=tuple(r for r, _, _ in waiting),
        evidence=tuple(Evidence(f"rank {r}: {m}") for r, m, _ in waiting[:4]),
    )
    return RuleOutcome(
        rule="world_size",
        findings=(finding,),
        verdict=Verdict.MISMATCH,
        confirmed=True,
        started_t=since,
        onset_t=since + WAIT_S,
        stalled=frozenset(r for r, _, _ in waiting),
    )
