"""network: every rank is stuck and none is behind: which link stopped carrying bytes.

When every rank of the job has made no progress past the hang threshold, alive, and no rule
names a culprit, each node's launcher has looked at its own ranks' TCP connections and probed
the peer hosts they talk to (ddpdoctor.monitor.follow.net_watch). This rule joins the nodes'
looks: a connection from host A to host B with bytes queued, retransmissions and no ACK for
seconds, segments that one side sent and the other never received (the two ends of one
connection, seen from both hosts), a probe from A to B that times out, an interface that is
down, a name that no longer resolves to what it did. It names the host pair and the direction.

Only a look that shows a fault makes a finding: links that carry and probes that answer say
nothing, so a healthy job (and a hang the network did not cause) gets none from this rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, fmt_s
from ddpdoctor.monitor.model.network import LinkView, NameView, NodeNetwork
from ddpdoctor.monitor.model.snapshot import RankState, Snapshot, Verdict

MIN_LOST = 2  # segments one end sent and the other never received, to count as lost
CONFIRM_AFTER = 2.0  # the stall, in hang thresholds, before the job is stopped for the network
SILENT_ACK_MS = 3000  # no ACK for this long with bytes outstanding: the link carries nothing
FIX = (
    "Every rank is alive and waits for data that does not arrive: the network between these "
    "hosts drops it. Check the firewall rules on both hosts (iptables -S, nft list ruleset) for "
    "the job's ports, the interfaces' state (ip link), the route between them and the switch "
    "port; `ddpdoctor doctor --distributed` on every node tests the paths between them."
)
NAME_FIX = (
    "A host name the job relies on no longer resolves to the address it had when the job "
    "started: check /etc/hosts and the DNS records of that host. Established connections keep "
    "working, but a restart, a new process group or a reconnect goes to the new answer."
)


@dataclass
class _Pair:
    """What was seen of the traffic from host `src` to host `dst`."""

    src: str
    dst: str
    evidence: list[str] = field(default_factory=list)
    silent: bool = False  # sockets show src's bytes going unacknowledged / unreceived
    probe_failed: bool = False
    lost: int = 0  # segments src sent on a connection that dst's end never received
    matched: bool = False  # a connection from src to dst was seen from both ends
    # src's segments to dst needed retransmitting (or are in flight): with none lost, they
    # reached dst, and it was dst's ACKs that did not come back
    sending: bool = False


def _host_of(addr: str, reports: Sequence[NodeNetwork]) -> str:
    """The host an address belongs to: the node whose look lists it, else a name the job relies
    on that resolves to it (the other node's look may be missing), else the address."""
    for report in reports:
        if report.owns(addr):
            return report.host
    for report in reports:
        for name in report.names:
            if addr in name.now or addr in (name.before or ()):
                return name.name
    return addr


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n} bytes"


def symmetric_stall(snap: Snapshot) -> tuple[float, str] | None:
    """(how long, what they wait in) when every rank is alive and none has progressed past the
    hang threshold; None otherwise."""
    th = snap.thresholds
    if th is None or not snap.ranks:
        return None
    latest = None
    for view in snap.ranks:
        if view.state not in (RankState.STALLED, RankState.WAITING) or view.alive is False:
            return None
        if view.last_progress_t is None:
            return None
        latest = view.last_progress_t if latest is None else max(latest, view.last_progress_t)
    assert latest is not None
    stalled = snap.taken_t - latest
    if stalled < th.hang_after_s:
        return None
    colls = {(v.collective.op, v.collective.seq) for v in snap.ranks if v.collective is not None}
    what = "the same step"
    if len(colls) == 1 and all(v.collective is not None for v in snap.ranks):
        op, seq = next(iter(colls))
        what = f"{op} #{seq}"
    else:
        pending = set()
        for view in snap.ranks:
            fr = snap.fr_of(view.rank)
            entry = (
                next((e for e in reversed(fr.entries) if e.state != "completed"), None)
                if fr
                else None
            )
            pending.add((entry.op, entry.seq) if entry else None)
        if len(pending) == 1 and None not in pending:
            op, seq = next(iter(pending))  # type: ignore[misc]
            what = f"{op} #{seq} (flight recorder)"
    return stalled, what


def _pairs(reports: Sequence[NodeNetwork]) -> dict[tuple[str, str], _Pair]:
    pairs: dict[tuple[str, str], _Pair] = {}

    def pair(src: str, dst: str) -> _Pair:
        return pairs.setdefault((src, dst), _Pair(src, dst))

    ends: dict[tuple[str, int, str, int], LinkView] = {}
    for report in reports:
        for link in report.links:
            ends[(link.local, link.local_port, link.peer, link.peer_port)] = link
    for report in reports:
        src = report.host
        for link in report.links:
            dst = _host_of(link.peer, reports)
            outstanding = link.send_q > 0
            ack_ms = link.last_ack_ms or 0
            no_ack = ack_ms >= SILENT_ACK_MS
            if outstanding and no_ack and (link.retransmits or link.total_retrans):
                p = pair(src, dst)
                if not p.silent:
                    p.evidence.append(
                        f"{_mb(link.send_q)} queued on rank {link.rank}'s connection to "
                        f"{link.peer}:{link.peer_port}, {link.retransmits} retransmits, "
                        f"no ACK for {fmt_s(ack_ms / 1000)}"
                    )
                p.silent = True
            other = ends.get((link.peer, link.peer_port, link.local, link.local_port))
            if other is not None and link.segs_out is not None and other.segs_in is not None:
                p = pair(src, dst)
                p.matched = True
                p.lost = max(p.lost, link.segs_out - other.segs_in)
                # sending now (bytes queued, a retransmission backing off), not ever: the
                # connection's lifetime retransmits are from before the stall as well
                p.sending = p.sending or outstanding or bool(link.retransmits)
        for probe in report.probes:
            if not probe.answered:
                dst = _host_of(probe.addr, reports)
                p = pair(src, dst)
                p.probe_failed = True
                p.evidence.append(
                    f"a probe from {src} to {dst} ({probe.addr}:{probe.port}) {probe.outcome}"
                )
    return pairs


def _interfaces_down(reports: Sequence[NodeNetwork]) -> list[str]:
    out = []
    for report in reports:
        used = {link.local for link in report.links}
        for addr, iface, state in report.addresses:
            if addr in used and state in ("down", "no carrier"):
                out.append(
                    f"{report.host}'s {iface} ({addr}) {'is down' if state == 'down' else 'has no carrier'}"
                )
    return out


def name_changes(reports: Sequence[NodeNetwork]) -> list[tuple[str, NameView]]:
    out = []
    for report in reports:
        for name in report.names:
            if name.before is not None and set(name.before) != set(name.now):
                out.append((report.host, name))
    return out


def describe_name(host: str, name: NameView) -> str:
    before = ", ".join(name.before or ()) or "nothing"
    now = ", ".join(name.now) or f"nothing ({name.error})" if not name.now else ", ".join(name.now)
    return f"on {host}, {name.role} {name.name} resolved to {before} when the job started; now to {now}"


def detect(snap: Snapshot) -> RuleOutcome | None:
    reports = snap.network
    if not reports:
        return None
    stall = symmetric_stall(snap)
    if stall is None:
        return None
    stalled_s, what = stall
    pairs = _pairs(reports)
    down = _interfaces_down(reports)
    names = name_changes(reports)
    faulty = [p for p in pairs.values() if p.silent or p.probe_failed or p.lost >= MIN_LOST]
    if not faulty and not down:
        return None
    directions = sorted(faulty, key=lambda p: (not p.silent, p.lost < MIN_LOST, p.src, p.dst))
    first = directions[0] if directions else None
    parts = [f"hang: every rank waits in {what} ({fmt_s(stalled_s)} without progress)"]
    if first is not None:
        # with an interface down, counters stop where the kernel stops sending: no direction
        one_way = _one_way(first, pairs) if not down else None
        if one_way is not None:
            link = f"the link {one_way[0]} → {one_way[1]} carries nothing ({one_way[1]} → {one_way[0]} does)"
        else:
            a, b = sorted((first.src, first.dst))
            link = f"the link between {a} and {b} carries nothing in either direction"
        sockets = next((e for p in directions for e in p.evidence if "queued" in e), None)
        parts.append(f"{link}: {sockets}" if sockets else link)
        parts.extend(sorted({_probe_phrase(p) for p in directions if p.probe_failed}))
    parts.extend(down)
    parts.extend(describe_name(h, n) for h, n in names)
    evidence = [Evidence(e) for p in directions for e in p.evidence]
    for p in directions:
        if p.lost >= MIN_LOST:
            evidence.append(
                Evidence(
                    f"{p.lost} segments {p.src} sent on the job's connections never reached {p.dst}"
                )
            )
    evidence.extend(Evidence(d) for d in down)
    evidence.extend(Evidence(describe_name(h, n)) for h, n in names)
    finding = Finding(
        id="network.link",
        severity=Severity.ERROR,
        summary="; ".join(parts),
        fix=FIX if not names else f"{FIX} {NAME_FIX}",
        ranks=(),
        evidence=tuple(evidence[:12]),
    )
    latest = max(r.t for r in reports)
    started = snap.taken_t - stalled_s
    return RuleOutcome(
        rule="network",
        findings=(finding,),
        verdict=Verdict.HANG,
        started_t=started,
        onset_t=max(latest, started + snap.thresholds.hang_after_s if snap.thresholds else latest),
        # stopped only once it is certain and lasting: a peer that does not answer (or an
        # interface down) in a look the watcher vouches for, and no progress for twice the hang
        # threshold; a link that comes back sooner resumes the job (TCP retransmits), and the
        # finding goes with the stall
        confirmed=_certain([r for r in reports if r.vouched])
        and snap.thresholds is not None
        and stalled_s >= CONFIRM_AFTER * snap.thresholds.hang_after_s,
    )


def _certain(looks: Sequence[NodeNetwork]) -> bool:
    """These looks alone show a peer that does not answer or an interface down."""
    return any(p.probe_failed for p in _pairs(looks).values()) or bool(_interfaces_down(looks))


def _probe_phrase(p: _Pair) -> str:
    return (
        f"a probe from {p.src} to {p.dst} times out"
        if any("timed out" in e for e in p.evidence)
        else f"a probe from {p.src} to {p.dst} gets no answer"
    )


def _one_way(p: _Pair, pairs: dict[tuple[str, str], _Pair]) -> tuple[str, str] | None:
    """(src, dst) when the segment counts of both ends show one direction alone losing, and
    the other direction delivering: nothing lost there although its sender has segments in
    flight or to send again now. A direction that sends nothing now proves nothing (its
    segments counted may all be from before the stall; every rank but one may just be waiting
    to receive, as at a cut both ways): then no direction is claimed."""
    there = pairs.get((p.src, p.dst))
    back = pairs.get((p.dst, p.src))
    if there is None or back is None or not (there.matched and back.matched):
        return None
    if there.lost >= MIN_LOST and back.lost <= 0 and back.sending:
        return p.src, p.dst
    if back.lost >= MIN_LOST and there.lost <= 0 and there.sending:
        return p.dst, p.src
    return None


def names(snap: Snapshot) -> RuleOutcome | None:
    """A name the job relies on that resolves to something else than when the job started,
    while the job runs (a stall's finding says it itself): a warning, never a verdict."""
    changes = name_changes(snap.network)
    if not changes:
        return None
    findings = tuple(
        Finding(
            id="network.name_changed",
            severity=Severity.WARNING,
            summary=describe_name(host, name),
            fix=NAME_FIX,
            ranks=(),
            evidence=(Evidence(describe_name(host, name)),),
        )
        for host, name in changes
    )
    return RuleOutcome(rule="network.names", findings=findings[:4])
