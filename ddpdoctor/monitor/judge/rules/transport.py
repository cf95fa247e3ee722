"""transport_stall: every rank of a group waits in the same collective and none is behind.

No rank is missing, so the program is not at fault: the collective itself does not complete.
That points at the transport (NCCL network, P2P, a firewall on the data ports) rather than at
the code.
"""

from __future__ import annotations

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, fmt_s
from ddpdoctor.monitor.judge.rules.hang import long_waiters, members_of
from ddpdoctor.monitor.model.snapshot import Snapshot, Verdict
from ddpdoctor.rank_ranges import named_ranks

FIX = (
    "Every rank reached this collective, so the code is not the cause: the data does not flow. "
    "Rerun with NCCL_DEBUG=INFO (ddpdoctor run sets it; read RUN_DIR/nccl/) and check the "
    "interface NCCL picked (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME), P2P between GPUs "
    "(try NCCL_P2P_DISABLE=1), InfiniBand state, and that no firewall blocks the ports between "
    "nodes; `ddpdoctor doctor` on every node tests these."
)


def detect(snap: Snapshot) -> RuleOutcome | None:
    th = snap.thresholds
    if th is None:
        return None
    for _group, waiters in long_waiters(snap).items():
        coll = waiters[0][1]
        members = members_of(coll, snap)
        in_it = {v.rank for v, c in waiters if c.seq == coll.seq and c.same_call(coll)}
        if not members or set(members) - in_it:
            continue
        latest = max((c.since_t for _, c in waiters if c.since_t is not None), default=None)
        evidence = [
            Evidence(
                f"{named_ranks(members)} all wait in {coll.describe()} "
                f"(longest {fmt_s(max(c.waiting_s for _, c in waiters))}), none is behind"
            )
        ]
        for line in snap.logs:
            if line.source.startswith("nccl") and line.level in ("error", "warn"):
                evidence.append(Evidence(line.text, line.file, line.line_no))
                if len(evidence) >= 6:
                    break
        finding = Finding(
            id="transport_stall",
            severity=Severity.ERROR,
            summary=f"all ranks are stuck in {coll.describe()}: the collective itself does not "
            "complete (transport, not program logic)",
            fix=FIX,
            ranks=(),
            evidence=tuple(evidence),
        )
        return RuleOutcome(
            rule="transport_stall",
            findings=(finding,),
            verdict=Verdict.HANG,
            started_t=latest,
            onset_t=(latest + th.hang_after_s) if latest is not None else snap.taken_t,
        )
    return None
