"""`--timeout` bounds the process group: a gloo init that never returns is abandoned at the
deadline (its cause reported), and a group the probe showed cannot form is never tried."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from ddpdoctor.checks.context import CheckContext, DoctorOptions
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.distributed_doctor import exchange, rank_setup
from ddpdoctor.distributed_doctor.facts import RankFacts
from ddpdoctor.launchers.identity import LaunchInfo

NEVER = threading.Event()  # never set: an init that waits on it never returns


class DictStore:
    """The few Store calls the doctor makes, on a dict."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]


class StuckDist:
    """torch.distributed whose init_process_group blocks like gloo waiting for a peer."""

    def __init__(self) -> None:
        self.inits = 0

    def PrefixStore(self, prefix: str, store: Any) -> Any:
        return store

    def init_process_group(self, *args: Any, **kwargs: Any) -> None:
        self.inits += 1
        NEVER.wait()


def setup(timeout_s: float, rank: int = 0) -> rank_setup.Setup:
    info = LaunchInfo("env", rank, 2, 0, None, None, "198.18.0.11", 29500, False, "run")
    context = CheckContext(env={}, options=DoctorOptions(smoke=False))
    deadline = time.monotonic() + timeout_s
    return rank_setup.Setup(info, [], context, timeout_s, False, deadline)


def payload_args(store: DictStore) -> tuple[Any, Any]:
    local = DoctorReport.build([], elapsed_s=0.0)
    facts = RankFacts(rank=0, local_rank=0, node_rank=None, host="h1", pid=1)
    peer = {"rank": 1, "facts": facts.to_json(), "report": local.to_json()}
    store.set("report/1", json.dumps(peer))  # the other rank's copy, as it would have left it
    return local, facts


def test_a_group_that_never_forms_is_abandoned_at_the_deadline(monkeypatch):
    monkeypatch.setattr(rank_setup, "ABANDONED", [])
    monkeypatch.setattr(exchange, "GROUP_MIN_S", 0.5)
    dist, store = StuckDist(), DictStore()
    local, facts = payload_args(store)
    started = time.monotonic()
    gathered, error, seconds = exchange.gather_reports(setup(1.0), dist, store, store, local, facts)
    took = time.monotonic() - started
    assert dist.inits == 1 and took < 3.0
    assert error == "it did not form within --timeout 1 s" and seconds is None
    assert rank_setup.ABANDONED == ["init_process_group"]  # the process will end with os._exit
    assert gathered is not None and [p["rank"] for p in gathered] == [0, 1]  # from the store


def test_a_group_the_probe_ruled_out_is_not_tried(monkeypatch):
    monkeypatch.setattr(rank_setup, "ABANDONED", [])
    dist, store = StuckDist(), DictStore()
    local, facts = payload_args(store)
    why = "gloo on node 0 (h1) listens on 127.0.1.1 (...), which node 1 (h2) cannot reach: refused"
    _, error, _ = exchange.gather_reports(setup(60.0), dist, store, store, local, facts, False, why)
    assert dist.inits == 0 and error == why and rank_setup.ABANDONED == []
