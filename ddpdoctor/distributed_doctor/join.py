"""Joining the ranks through a TCPStore we control, so a missing rank is named, not waited for.

torch's own rendezvous waits up to 15-30 minutes and then says "1/3 clients joined" (F05). Here
rank 0 hosts the store (or, under torchrun, every rank uses the agent's store), every rank writes
`joined/<rank>`, and rank 0 polls a counter until all are in or the deadline passes; then it
knows exactly which ranks never came. The other ranks wait for rank 0's verdict under `start`.

Non-zero ranks first wait for the store's port to accept connections with plain sockets, so an
absent rank 0 costs a quiet, bounded wait instead of c10d's retry logs.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from ddpdoctor.checks.probes.bounded import bounded_call
from ddpdoctor.launchers.identity import LaunchInfo

POLL_S = 0.1
KEY_PREFIX = "ddpdoctor"
LOCAL_HOST = "127.0.0.1"


class JoinError(Exception):
    """The join cannot go on; the message is a finding for the report or a one-line error."""

    def __init__(self, message: str, *, unresolved: bool = False, why: str = "") -> None:
        super().__init__(message)
        self.unresolved = unresolved  # the master's name never resolved before the deadline
        self.why = why or message  # the last error alone ("x does not resolve: ...")


@dataclass(frozen=True)
class Verdict:
    """Rank 0's word to the others once the join is over."""

    go: bool
    missing: tuple[int, ...] = ()
    reason: str = ""
    participants: tuple[int, ...] = ()  # ranks in the pairwise link matrix (one per node)
    backend: str = "gloo"  # for the collective check: nccl only when every rank has a GPU
    leaders: tuple[int, ...] = ()  # one rank per node, on several nodes: they probe each other


@dataclass(frozen=True)
class Reached:
    """MASTER_ADDR:MASTER_PORT answered: how, and how long its name took to resolve."""

    connect_ms: float
    name_wait_s: float | None  # how long the name did not resolve before it did; None: at once
    address: str  # the numeric address that accepted: the store is opened there, no lookup
    addresses: tuple[str, ...]  # everything the name resolved to


def wait_until_reached(
    host: str,
    port: int,
    deadline: float,
    *,
    connect_within: float | None = None,
    names: str = "MASTER_ADDR:MASTER_PORT",
    getaddrinfo: Callable[..., list[Any]] = socket.getaddrinfo,
) -> Reached:
    """Block until host:port accepts a TCP connection, by `deadline` whatever the resolver does.

    A name that does not resolve yet is retried like a port that does not answer yet: a
    Kubernetes headless service's name appears only once its pod is ready. Each lookup runs in
    a thread given what is left until the deadline (a DNS server that never answers cannot hold
    us past it); connects go to the numeric addresses. `connect_within`: once the name resolves,
    give up connecting after that many seconds (our own store answers at once or not at all).
    `names` are the variables the address and port came from, for the message; `getaddrinfo`
    is the resolver (tests give their own: no query leaves the machine).
    """
    last_error = "no answer"
    first = time.monotonic()
    unresolved_until: float | None = None
    resolved: tuple[str, ...] = ()
    give_up = deadline
    while True:
        remaining = give_up - time.monotonic()
        if remaining <= 0:
            raise JoinError(
                f"nothing answered at {names} {host}:{port} ({last_error}): rank 0 "
                f"did not start, or this host cannot reach it{_loopback_hint(host, resolved)}",
                unresolved=not resolved,
                why=last_error,
            )
        addresses, error = resolve_within(host, port, remaining, getaddrinfo)
        if error is not None:
            last_error = error
            unresolved_until = time.monotonic()
        else:
            if not resolved and connect_within is not None:
                give_up = min(deadline, time.monotonic() + connect_within)
            resolved = addresses
            for address in addresses:
                left = give_up - time.monotonic()
                start = time.perf_counter()
                try:
                    with socket.create_connection(
                        (address, port), timeout=min(2.0, max(left, 0.05))
                    ):
                        waited = unresolved_until - first if unresolved_until is not None else None
                        connect_ms = (time.perf_counter() - start) * 1e3
                        return Reached(connect_ms, waited, address, addresses)
                except OSError as exc:
                    last_error = exc.strerror or str(exc) or type(exc).__name__
        time.sleep(min(POLL_S * 2, max(0.0, give_up - time.monotonic())))


def resolve_within(
    host: str,
    port: int,
    timeout_s: float,
    getaddrinfo: Callable[..., list[Any]] = socket.getaddrinfo,
) -> tuple[tuple[str, ...], str | None]:
    """getaddrinfo(host) for TCP, given `timeout_s` at most: (addresses, None) or ((), why)."""
    outcome = bounded_call(
        lambda: getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout_s, name="resolve"
    )
    if outcome.timed_out:
        return (), f"{host} does not resolve: no answer from the DNS server"
    if isinstance(outcome.error, OSError):
        reason = outcome.error.strerror or str(outcome.error)
        return (), f"{host} does not resolve: {reason}"
    if outcome.error is not None:  # UnicodeError and friends: a name no resolver takes
        return (), f"{host} does not resolve: {outcome.error}"
    found: list[str] = []
    for info in outcome.value or ():
        address = str(info[4][0])
        if address not in found:
            found.append(address)
    return (tuple(found), None) if found else ((), f"{host} does not resolve: no address")


def _loopback_hint(host: str, addresses: tuple[str, ...]) -> str:
    """MASTER_ADDR=localhost on a node that is not rank 0's names the wrong machine (F10)."""
    if addresses and all(a.startswith("127.") or a == "::1" for a in addresses):
        return (
            f"; {host} is this host itself: on any node but rank 0's, MASTER_ADDR must be "
            "rank 0's node address on the network the nodes share"
        )
    return ""


def host_store(dist: Any, info: LaunchInfo, timeout_s: float) -> Any:
    """Rank 0's TCPStore server; it does not wait for clients, so polling stays ours.

    The server listens on every address of the host; its own client connects over loopback,
    so serving never waits on a name lookup (whether MASTER_ADDR names this host is
    wait_until_reached's question, bounded by the deadline)."""
    try:
        return dist.TCPStore(
            LOCAL_HOST,
            info.master_port,
            info.world_size,
            True,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            multi_tenant=True,
        )
    except Exception as exc:
        raise JoinError(
            f"cannot serve the rendezvous on port {info.master_port} of this host (rank 0): "
            f"{first_line(exc)}; another job or a leftover process holds it"
        ) from exc


def connect_store(dist: Any, info: LaunchInfo, timeout_s: float, address: str | None = None) -> Any:
    """A client of rank 0's store, at `address` (the numeric one that answered) when known, so
    c10d never looks the name up itself, without a time limit."""
    try:
        return dist.TCPStore(
            address or info.master_addr,
            info.master_port,
            info.world_size,
            False,
            timeout=timedelta(seconds=timeout_s),
        )
    except Exception as exc:
        raise JoinError(
            f"connected to {info.master_addr}:{info.master_port} but it is not a working "
            f"rendezvous store: {first_line(exc)}"
        ) from exc


def prefixed(dist: Any, store: Any, info: LaunchInfo, name: str) -> Any:
    """Keys of this doctor run, apart from the launcher's own and from earlier runs."""
    return dist.PrefixStore(f"{KEY_PREFIX}/{info.run_id}/{name}/", store)


def announce(store: Any, rank: int, record: dict[str, Any]) -> None:
    store.set(f"joined/{rank}", json.dumps(record))
    store.add("joined_count", 1)


def await_joins(store: Any, world: int, deadline: float) -> tuple[int, ...]:
    """Rank 0: wait until every rank announced itself; return the ranks still missing."""
    while time.monotonic() < deadline:
        # The counter is cheap to poll; the keys decide (a rank with a wrong RANK counts too).
        if int(store.add("joined_count", 0)) >= world and not _absent(store, "joined", world):
            return ()
        time.sleep(POLL_S)
    return _absent(store, "joined", world)


def mark_ready(store: Any, rank: int) -> None:
    """This rank finished its local checks and facts."""
    store.set(f"ready/{rank}", "1")
    store.add("ready_count", 1)


def await_ready(store: Any, world: int, deadline: float) -> tuple[int, ...]:
    """Rank 0: wait until every rank finished its checks; return the ranks that did not."""
    while time.monotonic() < deadline:
        if int(store.add("ready_count", 0)) >= world and not _absent(store, "ready", world):
            return ()
        time.sleep(POLL_S)
    return _absent(store, "ready", world)


def _absent(store: Any, kind: str, world: int) -> tuple[int, ...]:
    return tuple(r for r in range(world) if not store.check([f"{kind}/{r}"]))


def joined_records(store: Any, world: int, missing: tuple[int, ...]) -> dict[int, dict[str, Any]]:
    records = {}
    for rank in range(world):
        if rank in missing:
            continue
        try:
            records[rank] = json.loads(store.get(f"joined/{rank}"))
        except Exception:  # noqa: BLE001 - a rank that vanished after joining
            continue
    return records


def publish_verdict(store: Any, verdict: Verdict) -> None:
    store.set("start", json.dumps(asdict(verdict)))


def verdict_from_json(data: dict[str, Any]) -> Verdict:
    return Verdict(
        go=bool(data["go"]),
        missing=tuple(data.get("missing") or ()),
        reason=data.get("reason") or "",
        participants=tuple(data.get("participants") or ()),
        backend=data.get("backend") or "gloo",
        leaders=tuple(data.get("leaders") or ()),
    )


def publish_exit_code(store: Any, code: int) -> None:
    store.set("exit_code", str(code))


def acknowledge(store: Any) -> None:
    store.add("done_count", 1)


def await_acknowledgements(store: Any, expected: int, deadline: float) -> None:
    """Rank 0 may host the store: it stays until the others read the exit code (bounded)."""
    while time.monotonic() < deadline:
        if int(store.add("done_count", 0)) >= expected:
            return
        time.sleep(POLL_S)


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
