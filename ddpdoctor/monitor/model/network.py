"""What a node saw of its own ranks' network once they all stopped progressing: the state of
each rank's TCP connections to other hosts, whether each peer host answers a probe, the
interfaces of its addresses, and how the names the job relies on resolve.

Each launcher writes its look to RUN_DIR/nodes/node-<N>/network.json (the follow stage,
ddpdoctor.monitor.follow.net_watch); node 0 reads every node's and the judge's network rule joins
them (ddpdoctor.monitor.judge.rules.network). Parsing is strict and bounded: a field of the wrong
type drops the entry, never the reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ddpdoctor.protocol import jsontext

SCHEMA_VERSION = 1
MAX_LINKS = 64  # connections per node report
MAX_PROBES = 32
MAX_NAMES = 24
MAX_TEXT = 200


@dataclass(frozen=True)
class LinkView:
    """One rank's connection to another host, at the look."""

    rank: int
    local: str
    local_port: int
    peer: str
    peer_port: int
    state: str
    send_q: int
    recv_q: int
    retransmits: int
    total_retrans: int | None
    last_ack_ms: int | None
    segs_in: int | None
    segs_out: int | None


@dataclass(frozen=True)
class ProbeView:
    addr: str
    port: int
    answered: bool
    outcome: str
    ms: float


@dataclass(frozen=True)
class NameView:
    """A host name the job relies on: its answer when the job started and at the look."""

    name: str
    role: str  # "rendezvous endpoint", "MASTER_ADDR", "this host's name"
    before: tuple[str, ...] | None  # None: not looked up then
    now: tuple[str, ...]  # () with `error`: it does not resolve
    error: str | None = None
    lookup_s: float | None = None


@dataclass(frozen=True)
class NodeNetwork:
    node_rank: int
    host: str
    t: float  # when the look was taken (unix time)
    stalled_s: float  # how long its ranks had made no progress then
    # (address, interface, its state: "up", "down" (set down), "no carrier" (up, link lost))
    addresses: tuple[tuple[str, str, str], ...]
    links: tuple[LinkView, ...]
    probes: tuple[ProbeView, ...]
    names: tuple[NameView, ...] = ()
    # Whether a live watcher vouches for the node that wrote the look (its own, or a node whose
    # launcher started ranks it vouched for): only such a look may confirm a stop. Never read
    # from the file (a file's claim explains, it does not stop); after the fact nothing stops.
    vouched: bool = True

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("vouched")
        data["schema_version"] = SCHEMA_VERSION
        return data

    def owns(self, address: str) -> bool:
        return any(addr == address for addr, _, _ in self.addresses)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("not text")
    return value[:MAX_TEXT]


def _int(value: Any) -> int:
    if not jsontext.is_int(value):
        raise ValueError("not an int")
    return int(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _entries(value: Any, limit: int) -> list[Mapping[str, Any]]:
    if not isinstance(value, list):
        return []
    return [v for v in value[:limit] if isinstance(v, Mapping)]


def _link(data: Mapping[str, Any]) -> LinkView:
    return LinkView(
        rank=_int(data.get("rank")),
        local=_text(data.get("local")),
        local_port=_int(data.get("local_port")),
        peer=_text(data.get("peer")),
        peer_port=_int(data.get("peer_port")),
        state=_text(data.get("state")),
        send_q=_int(data.get("send_q")),
        recv_q=_int(data.get("recv_q")),
        retransmits=_int(data.get("retransmits")),
        total_retrans=_opt_int(data.get("total_retrans")),
        last_ack_ms=_opt_int(data.get("last_ack_ms")),
        segs_in=_opt_int(data.get("segs_in")),
        segs_out=_opt_int(data.get("segs_out")),
    )


def _probe(data: Mapping[str, Any]) -> ProbeView:
    ms = data.get("ms")
    if not isinstance(data.get("answered"), bool) or not jsontext.is_number(ms):
        raise ValueError("bad probe")
    return ProbeView(
        _text(data.get("addr")),
        _int(data.get("port")),
        data["answered"],
        _text(data.get("outcome")),
        float(ms),
    )


def _answers(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ValueError("not a list")
    return tuple(_text(v) for v in value[:16])


def _name(data: Mapping[str, Any]) -> NameView:
    before = data.get("before")
    lookup = data.get("lookup_s")
    error = data.get("error")
    return NameView(
        name=_text(data.get("name")),
        role=_text(data.get("role")),
        before=None if before is None else _answers(before),
        now=_answers(data.get("now")),
        error=None if error is None else _text(error),
        lookup_s=float(lookup) if jsontext.is_number(lookup) else None,
    )


def _kept(parse, entries):
    out = []
    for entry in entries:
        try:
            out.append(parse(entry))
        except (ValueError, TypeError):
            continue
    return tuple(out)


def node_network_from_json(data: Any) -> NodeNetwork | None:
    """A node's report as read (None when it is not one)."""
    if not isinstance(data, Mapping) or data.get("schema_version") != SCHEMA_VERSION:
        return None
    try:
        addresses = []
        for entry in (data.get("addresses") or [])[:64]:
            if isinstance(entry, list) and len(entry) == 3:
                addresses.append((_text(entry[0]), _text(entry[1]), _text(entry[2])))
        t, stalled = data.get("t"), data.get("stalled_s")
        if not (jsontext.is_number(t) and jsontext.is_number(stalled)):
            return None
        return NodeNetwork(
            node_rank=_int(data.get("node_rank")),
            host=_text(data.get("host")),
            t=float(t),
            stalled_s=float(stalled),
            addresses=tuple(addresses),
            links=_kept(_link, _entries(data.get("links"), MAX_LINKS)),
            probes=_kept(_probe, _entries(data.get("probes"), MAX_PROBES)),
            names=_kept(_name, _entries(data.get("names"), MAX_NAMES)),
        )
    except (ValueError, TypeError):
        return None
