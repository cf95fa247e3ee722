"""The reachability probe as a phase of the distributed doctor, through the store.

Once rank 0 said go, each node's leader listens, publishes its addresses, probes the other leaders
and publishes what it saw; rank 0 collects it all (bounded), decides whether gloo's process group
can form, and publishes that decision, which every rank waits for before `init_process_group`.
A leader keeps its listener open until the decision, since the others may still be probing it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ddpdoctor.distributed_doctor.reach import (
    Listener,
    Probe,
    describe_self,
    gloo_choice,
    local_addresses,
    probe_peers,
    publish_self,
    read_keys,
    token,
)
from ddpdoctor.distributed_doctor.reach_verdict import IFNAME_VARS, Reach

# The whole probe fits in this, whatever --timeout says: connects take milliseconds or fail.
PHASE_S = 6.0


def leader_side(
    store: Any,
    rank: int,
    leaders: Sequence[int],
    run_id: str,
    env: Mapping[str, str],
    deadline: float,
) -> Listener:
    """Listen, publish, probe the other leaders, publish the results. Returns the listener,
    which the caller closes once rank 0's decision is in."""
    addresses = local_addresses()
    listener = Listener(token(run_id, rank))
    info = describe_self(listener.port, addresses, gloo_choice(env, addresses))
    info["env"] = {k: env[k] for k in IFNAME_VARS if env.get(k)}
    publish_self(store, rank, info)
    end = min(deadline, time.monotonic() + PHASE_S)
    peers = read_keys(store, [f"reach/addr/{r}" for r in leaders], end)
    known = {r: peers[f"reach/addr/{r}"] for r in leaders if peers.get(f"reach/addr/{r}")}
    probes = probe_peers(rank, known, run_id, end)
    store.set(f"reach/probes/{rank}", json.dumps([p.__dict__ for p in probes]))
    return listener


def collect(store: Any, leaders: Sequence[int], deadline: float) -> Reach:
    """Rank 0: every leader's record and probes that arrive before the deadline."""
    end = min(deadline, time.monotonic() + PHASE_S + 1)
    keys = [f"reach/{kind}/{r}" for r in leaders for kind in ("addr", "probes")]
    found = read_keys(store, keys, end)
    infos = {r: found[f"reach/addr/{r}"] for r in leaders if found.get(f"reach/addr/{r}")}
    probes = [
        Probe.from_json(p)
        for r in leaders
        for p in (found.get(f"reach/probes/{r}") or ())
        if isinstance(p, dict)
    ]
    missing = tuple(r for r in leaders if found.get(f"reach/probes/{r}") is None)
    return Reach(infos, probes, missing)


def publish_decision(store: Any, blocker: str | None) -> None:
    store.set("reach/decision", json.dumps({"form": blocker is None, "reason": blocker}))


def await_decision(store: Any, deadline: float) -> tuple[bool, str | None]:
    """Every rank: rank 0's word on forming the group; no word by the deadline means stop."""
    found = read_keys(store, ["reach/decision"], deadline).get("reach/decision")
    if not isinstance(found, dict):
        return False, "rank 0 sent no word on the process group in time"
    return bool(found.get("form")), found.get("reason")


def run_phase(
    store: Any,
    rank: int,
    leaders: Sequence[int],
    run_id: str,
    env: Mapping[str, str],
    deadline: float,
    decide: Callable[[Reach], str | None] | None,
) -> tuple[Reach | None, bool, str | None]:
    """The phase on one rank: (what rank 0 collected, or None elsewhere; form the group?; why
    not). `decide` is rank 0's judge (None on the others)."""
    listener = None
    reach = None
    if rank in leaders:
        listener = leader_side(store, rank, leaders, run_id, env, deadline)
    try:
        if decide is not None:
            reach = collect(store, leaders, deadline)
            publish_decision(store, decide(reach))
        form, reason = await_decision(store, deadline)
    finally:
        if listener is not None:
            listener.close()
    return reach, form, reason
