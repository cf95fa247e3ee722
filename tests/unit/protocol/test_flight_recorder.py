"""Parsing PyTorch's flight-recorder dumps, on real gloo dumps (tests/fixtures/flight_recorder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.protocol.flight_recorder import KEEP_ENTRIES, parse_dump, trim

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "flight_recorder"


def load(case: str, rank: int):
    answer = json.loads((FIXTURES / case / f"rank-{rank}.json").read_text())
    return parse_dump(
        answer["dump"], rank=rank, request_id=answer["request_id"], taken_t=answer["taken_t"]
    )


def test_waiting_rank_has_the_gradient_all_reduce_pending():
    waiter = load("hang-gloo", 0)
    group = waiter.group("0")
    assert (group.last_enqueued, group.last_completed, group.last_started) == (8, 7, None)
    pending = waiter.pending("0")
    assert pending is not None and (pending.op, pending.seq, pending.backend) == (
        "all_reduce",
        8,
        "gloo",
    )
    assert pending.describe() == "all_reduce #8 (float32[2372])"
    assert waiter.state_of(pending) == "scheduled"  # gloo records no starts
    assert waiter.taken_t - pending.created_t > 3.0
    assert (
        waiter.summary()
        == "all_reduce #8 (float32[2372]) scheduled, not completed (last completed #7)"
    )


def test_culprit_rank_completed_everything_it_scheduled():
    culprit = load("hang-gloo", 1)
    assert culprit.pending("0") is None
    assert culprit.group("0").last_enqueued == 7
    assert culprit.entry("0", 7).op == "all_reduce"
    assert culprit.summary() == "all completed, last all_reduce #7 (float32[2372])"
    assert culprit.state_of(culprit.entry("0", 1)) == "completed"


def test_dtypes_are_named_as_events_name_them():
    dumps = [load("mismatch-gloo", r) for r in (0, 1)]
    assert [d.entry("0", 9).tensors() for d in dumps] == ["float32[4]", "int32[4]"]
    assert (
        dumps[0].entry("0", 10).op == "barrier"
        and dumps[0].entry("0", 10).tensors() == "no tensors"
    )


def test_to_json_is_the_diagnosis_section():
    data = load("hang-gloo", 0).to_json()
    assert data["rank"] == 0 and data["groups"][0]["last_scheduled"] == 8
    assert data["pending"][0]["seq"] == 8 and data["pending"][0]["input_dtypes"] == ["Float"]
    assert json.loads(json.dumps(data)) == data


@pytest.mark.parametrize("bad", [None, [], "text", {"entries": "x"}])
def test_what_is_not_a_dump_is_refused(bad):
    with pytest.raises(ValueError):
        parse_dump(bad, rank=0)


def test_odd_entries_are_skipped_not_fatal():
    dump = {
        "pg_status": {"0": {"last_enqueued_collective": "x", "last_completed_collective": None}},
        "entries": [{"profiling_name": 3}, "junk", {"profiling_name": "gloo:all_reduce"}],
    }
    parsed = parse_dump(dump, rank=2)
    assert len(parsed.entries) == 1 and parsed.entries[0].seq == 0
    assert parsed.group("0").last_enqueued == 0


def test_trim_keeps_the_latest_entries_without_frames():
    entries = [
        {"profiling_name": "nccl:all_reduce", "collective_seq_id": i, "frames": [{"name": "f"}]}
        for i in range(1, 200)
    ]
    trimmed = trim({"version": "2.10", "pg_status": {}, "entries": entries})
    assert len(trimmed["entries"]) == KEEP_ENTRIES
    assert trimmed["entries"][-1]["collective_seq_id"] == 199
    assert all("frames" not in e for e in trimmed["entries"])
