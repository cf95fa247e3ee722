"""Reading flight-recorder dump files and the per-group reading shared by the live diagnosis and
the post-mortem, on real dumps of plain torchrun jobs (tests/fixtures/flight_recorder/torch-dumps,
made by record_dumps.py there)."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path

import pytest

from ddpdoctor.protocol.fr_files import DumpError, is_dump_file, load_dump
from ddpdoctor.protocol.fr_reading import read_groups, user_first

DUMPS = Path(__file__).resolve().parents[2] / "fixtures" / "flight_recorder" / "torch-dumps"


def dumps_of(name: str):
    return [load_dump(p) for p in sorted((DUMPS / name).glob("fr_trace_rank_*"))]


def test_a_pickled_dump_is_read_with_its_rank_from_the_file_name_and_its_frames():
    (dump,) = dumps_of("hang")
    assert dump.rank == 0 and dump.world == (0, 1)
    last = dump.entries[-1]
    assert (last.op, last.seq, last.backend, last.timeout_s) == ("all_reduce", 6, "gloo", 3.0)
    assert dump.state_of(last) == "scheduled"
    frames = user_first(last.frames)
    assert frames[0].endswith("train.py:100 train")  # the user's line first, torch's after
    assert any("distributed_c10d.py" in f for f in frames[-2:])


def test_the_json_form_reads_like_the_pickle():
    pickled = [e.describe() for e in dumps_of("mismatch")[1].entries]
    as_json = [e.describe() for e in dumps_of("mismatch-json")[1].entries]
    assert pickled == as_json and as_json[-1] == "broadcast #6 (float32[4])"


def test_the_hang_rank_1_never_reached_all_reduce_6_and_left_no_dump():
    (default,) = read_groups(dumps_of("hang"))
    assert (default.kind, default.seq, default.never_reached) == ("never_reached", 6, (1,))
    assert default.no_dump == (1,) and default.members == (0, 1)
    assert [p.rank for p in default.waiting] == [0]


@pytest.mark.parametrize(
    ("name", "why", "sides"),
    [
        ("mismatch", "COLLECTIVE_TYPE_MISMATCH", {0: "all_reduce #6 (float32[4])",
                                                  1: "broadcast #6 (float32[4])"}),
        ("size", "SIZE_OR_SYNTAX_MISMATCH", {0: "all_reduce #6 (float32[4])",
                                             1: "all_reduce #6 (float32[8])"}),
        ("dtype", "COLLECTIVE_DTYPE_MISMATCH", {0: "all_reduce #6 (float32[4])",
                                                1: "all_reduce #6 (int32[4])"}),
    ],
)  # fmt: skip
def test_mismatches_at_6_in_torchs_analyzers_words(name, why, sides):
    (default,) = read_groups(dumps_of(name))
    assert (default.kind, default.seq) == ("mismatch", 6)
    assert default.why.startswith(why)
    assert {r: e.describe() for r, e in default.calls.items()} == sides


def test_a_subgroup_is_read_on_its_own_and_a_rank_outside_it_is_not_a_member():
    experts, default = read_groups(dumps_of("subgroup"))
    assert (experts.label, experts.kind, experts.seq) == ("group experts", "never_reached", 3)
    assert experts.never_reached == (2,) and experts.members == (1, 2)  # rank 0's dump lacks it
    assert default.pg == "0" and default.members == (0, 1, 2)


def test_an_exited_rank_leaves_only_the_others_last_call_when_gloo_retired_it():
    (default,) = read_groups(dumps_of("exited-late"))
    assert (default.kind, default.seq, default.no_dump) == ("no_dump", 6, (1,))


def test_the_files_time_stands_for_the_dumps_only_when_it_can_be_the_watchdogs(tmp_path):
    copy = tmp_path / "fr_trace_rank_0"
    copy.write_bytes((DUMPS / "hang" / "fr_trace_rank_0").read_bytes())
    assert load_dump(copy).taken_t == 0.0  # written now, long after its calls: says nothing
    created = load_dump(copy).entries[-1].created_t
    os.utime(copy, (created + 3.2, created + 3.2))
    (default,) = read_groups([load_dump(copy)])
    assert default.waiting[0].waited_s == pytest.approx(3.2, abs=0.01)


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    bad = tmp_path / "fr_trace_rank_0"
    bad.write_bytes(pickle.dumps({"entries": [Evil()]}, protocol=4))
    assert is_dump_file(bad)
    with pytest.raises(DumpError, match="refusing to load"):
        load_dump(bad)
    assert not (tmp_path / "pwned").exists()


def test_a_dump_without_a_rank_in_its_name_or_not_a_dump(tmp_path):
    nameless = tmp_path / "trace.pkl"
    nameless.write_bytes((DUMPS / "hang" / "fr_trace_rank_0").read_bytes())
    with pytest.raises(DumpError, match="does not end with the rank"):
        load_dump(nameless)
    log = tmp_path / "rank0.log"
    log.write_text("hello\n")
    assert not is_dump_file(log)
    torn = tmp_path / "fr_trace_rank_3.json"
    torn.write_text('{"entries": [')
    assert is_dump_file(torn)
    with pytest.raises(DumpError, match="not a flight-recorder dump"):
        load_dump(torn)


def test_ddpdoctors_own_answers_are_read_too(tmp_path):
    raw = json.loads((DUMPS / "mismatch-json" / "fr_trace_rank_1.json").read_text())
    answer = {"schema_version": 1, "request_id": "fr-1", "rank": 1, "taken_t": time.time(),
              "dump": raw, "error": None}  # fmt: skip
    path = tmp_path / "rank-1.json"
    path.write_text(json.dumps(answer))
    dump = load_dump(path)
    assert dump.rank == 1 and dump.entries[-1].op == "broadcast"
