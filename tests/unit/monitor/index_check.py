"""The rules that read the rank index (ddpdoctor/monitor/model/rank_index.py) must say what they
said when they walked every rank: `same_both_ways(snap)` runs each of them, and the diagnosis,
both ways on one snapshot and compares what they return in full.

test_monitor_builders.snap() calls it on every snapshot the rules' tests build (the suite sets
DDPDOCTOR_CHECK_INDEX, tests/unit/conftest.py), and test_rank_index.py on random snapshots.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from ddpdoctor.monitor.judge.diagnose import Diagnosis, _diagnose
from ddpdoctor.monitor.judge.rules import (
    chance_pairing,
    contract,
    crash,
    grad_syncs,
    hang,
    mismatch,
    p2p,
    pipeline_contract,
    replica_compare,
    replicas,
    runtime_warnings,
    sampler,
    straggler,
    transport,
    wait,
    world_size,
)
from ddpdoctor.monitor.model import rank_index
from ddpdoctor.monitor.model.snapshot import Snapshot

# Every function whose walk over the ranks the index replaced, and the rules that call them.
RULES: dict[str, Callable[[Snapshot], Any]] = {
    "crash.failures": crash.failures,
    "crash.detect": crash.detect,
    "grad_syncs": grad_syncs.detect,
    "p2p.unmatched_at_end": p2p.unmatched_at_end,
    "p2p": p2p.detect,
    "hang.long_waiters": hang.long_waiters,
    "hang": hang.detect,
    "transport": transport.detect,
    "wait.current_waits": wait.current_waits,
    "wait": wait.detect,
    "contract": contract.detect,
    "pipeline_contract": pipeline_contract.detect,
    "world_size": world_size.detect,
    "runtime_warnings": runtime_warnings.detect,
    "sampler": sampler.detect,
    "replica_compare.of_snapshot": replica_compare.of_snapshot,
    "replicas": replicas.detect,
    "replicas.notes": replicas.notes,
    "mismatch": mismatch.detect,
    "chance_pairing": chance_pairing.detect,
    "straggler.own_work": straggler.own_work,
    "straggler": straggler.detect,
}


def form(value: Any) -> Any:
    """`value` in a form that compares in full: findings and views as their JSON, every other
    dataclass field by field, floats by their repr (NaN equals NaN, -0.0 is not 0.0)."""
    if isinstance(value, Diagnosis):
        return {
            **{f.name: form(getattr(value, f.name)) for f in dataclasses.fields(value)},
            "findings": [f.to_json() for f in value.findings],
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: form(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if hasattr(value, "to_json"):
            fields["json"] = form(value.to_json())
        return (type(value).__name__, fields)
    if isinstance(value, dict):
        return [(form(k), form(v)) for k, v in value.items()]  # (in order: order is output)
    if isinstance(value, (list, tuple)):
        return [form(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(repr(form(v)) for v in value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    return value


def outcome(call: Callable[[], Any]) -> Any:
    try:
        return form(call())
    except Exception as exc:  # the same failure both ways is the same outcome
        return ("raised", type(exc).__name__, str(exc))


def same_both_ways(snap: Snapshot) -> None:
    """Each rule of RULES and the diagnosis, with the index and walking every rank: equal."""
    calls: dict[str, Callable[[], Any]] = {
        name: (lambda rule=rule: rule(snap)) for name, rule in RULES.items()
    }
    calls["diagnose"] = lambda: _diagnose(snap, extra_findings=(), held=None)
    for name, call in calls.items():
        indexed = outcome(call)
        with rank_index.walking_every_rank():
            walked = outcome(call)
        assert indexed == walked, f"{name}: {indexed!r}\n!= walking every rank: {walked!r}"
