"""Crafted input gets one line: every reader, fed a generated corpus of hostile documents (wrong
types, NaN/Infinity, 1e400, 400-digit integers, deep nesting, in every field the readers look
at), answers with its documented refusal (exit 2 and `ddpdoctor: error: ...`), a skipped line,
or a verdict: never "internal error" (exit 3), which is for ddpdoctor's own bugs.

Derandomized and bounded (hypothesis's `derandomize`, a fixed number of examples, no example
database), so the corpus is the same on every run and the module takes a few seconds.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpdoctor.checks.gate import refusal_findings
from ddpdoctor.cli import main
from ddpdoctor.monitor.follow.checkup import notes_of
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.protocol.fr_files import DumpError, load_dump
from ddpdoctor.protocol.node_summary import NodeSummary
from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.report.html import _findings, _stacks, _verdict
from ddpdoctor.report.timeline import add_diagnosis_waits, add_stalls, read_timeline
from ddpdoctor.report.trace import trace_events
from tests.unit.monitor.test_monitor_watch_cmd import healthy_run


def fuzz(examples: int):
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


# JSON text, not values: Python's json would never write most of these.
HOSTILE_LEAVES = [
    "Infinity", "-Infinity", "NaN", "1e400", "-1e400", "1" * 400, "-" + "9" * 30, "1e308",
    "0", "-1", "2.5", "true", "false", "null", '""', '"x\\u001b]52;c;x\\u0007"', "[]", "{}",
    '"' + "a" * 5000 + '"', "[" * 70 + "]" * 70, "[" * 5000 + "]" * 5000, "9" * 20,
]  # fmt: skip
KEYS = [
    "verdict", "findings", "ranks", "stacks", "culprits", "run", "world_size", "rank", "step",
    "t", "mono", "kind", "seq", "op", "group", "collective", "waiting_s", "evidence", "summary",
    "fix", "severity", "id", "frames", "entries", "pg_status", "pg_config", "profiling_name",
    "input_sizes", "time_created_ns", "counts", "results", "status", "group", "facts",
    "node_rank", "pid", "host", "hosts", "launcher_pid", "started_t", "exit_code", "code",
    "dump", "request_id", "taken_t", "detected_after_s", "last_progress_t", "schema_version",
    "local_rank", "since_t", "open", "step_time_s", "data_time_s", "line", "file", "text",
    "finding", "block", "details", "title", "last", "after", "events", "final", "stopped_for",
]  # fmt: skip

leaf = st.sampled_from(HOSTILE_LEAVES)


def _obj(pairs: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in pairs) + "}"


hostile = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda items: "[" + ",".join(items) + "]"),
        st.lists(st.tuples(st.sampled_from(KEYS), inner), max_size=5).map(_obj),
    ),
    max_leaves=12,
)
# a valid-looking document with some fields replaced: gets past "is it a dict" to the fields
overrides = st.lists(st.tuples(st.sampled_from(KEYS), hostile), min_size=1, max_size=5)


def overlay(base: dict, pairs: list[tuple[str, str]]) -> str:
    fields = {k: json.dumps(v) for k, v in base.items()}
    fields.update(dict(pairs))
    return _obj(list(fields.items()))


def no_internal_error(code: int, err: str) -> None:
    assert code in (0, 1, 2), err
    assert "internal error" not in err and "Traceback" not in err, err


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    return healthy_run(tmp_path_factory.mktemp("fuzz"))


def fresh_copy(base: Path) -> Path:
    target = Path(tempfile.mkdtemp(prefix="fuzz-")) / "run"
    shutil.copytree(base, target)
    return target


@fuzz(100)
@given(st.one_of(hostile, st.text(max_size=200)))
def test_json_text_is_a_value_or_a_value_error(text):
    try:
        jsontext.loads(text)
    except ValueError:
        pass


@fuzz(80)
@given(overrides, st.sampled_from(["hello", "step", "heartbeat", "collective_start", "exit"]))
def test_an_event_line_is_an_event_or_skipped(pairs, kind):
    line = overlay({"v": 1, "t": 1.0, "mono": 1.0, "rank": 0, "kind": kind}, pairs)
    event = parse_event_line(line.encode())
    assert event is None or isinstance(event.get("rank"), int)


@fuzz(60)
@given(hostile)
def test_doctor_reports_are_read_whatever_they_hold(document):
    try:
        report = jsontext.loads(document)
    except ValueError:
        return
    for value in (report, {"results": report}, {"results": [report]}):
        refusal_findings(value)
        notes_of(value)


@fuzz(60)
@given(overrides)
def test_a_node_summary_head_is_one_or_refused(pairs):
    text = overlay({"schema_version": 1, "node_rank": 1, "seq": 1, "t": 1.0, "ranks": []}, pairs)
    try:
        NodeSummary.from_head(jsontext.loads(text))
    except ValueError:
        pass


RUN_FILES = {
    "run.json": {"world_size": 2, "backend": "gloo", "hosts": ["h"], "launcher_pid": 1},
    "diagnosis.json": {"schema_version": 1, "verdict": "hang", "culprits": [1], "final": True},
    "events/rank-1.jsonl": {"v": 1, "t": 2.0, "mono": 2.0, "rank": 1, "kind": "heartbeat"},
    "doctor.json": {"schema_version": 1, "results": [], "counts": {}},
    "nodes/node-1/node.json": {"node_rank": 1, "host": "h", "pid": 1},
}


@fuzz(12)
@given(st.sampled_from(sorted(RUN_FILES)), overrides)
def test_watch_reads_a_crafted_run_directory(base_run, capsys, name, pairs):
    run = fresh_copy(base_run)
    target = run / name
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = "a" if name.endswith(".jsonl") else "w"
    with target.open(mode) as fh:
        fh.write(overlay(RUN_FILES[name], pairs) + "\n")
    code = main(["watch", str(run), "--json"])
    no_internal_error(code, capsys.readouterr().err)
    shutil.rmtree(run.parent)


@fuzz(60)
@given(overrides, overrides, st.sampled_from(["heartbeat", "collective_start", "step"]))
def test_the_report_draws_any_diagnosis_and_events(tmp_path, diagnosis_pairs, event_pairs, kind):
    events = tmp_path / "events"
    events.mkdir(exist_ok=True)
    base = {"v": 1, "t": 2.0, "mono": 2.0, "rank": 1, "kind": kind, "op": "all_reduce"}
    lines = [json.dumps({**base, "kind": "hello"}), overlay(base, event_pairs)]
    (events / "rank-1.jsonl").write_text("\n".join(lines) + "\n")
    timeline = read_timeline(RunDir(tmp_path))
    try:
        diagnosis = jsontext.loads(overlay(RUN_FILES["diagnosis.json"], diagnosis_pairs))
    except ValueError:
        return
    add_diagnosis_waits(timeline, diagnosis)
    add_stalls(timeline, diagnosis)
    _verdict(diagnosis), _findings(diagnosis), _stacks(diagnosis)
    trace_events(timeline)


@fuzz(3)
@given(st.sampled_from(["diagnosis.json", "events/rank-1.jsonl"]), overrides)
def test_report_reads_a_crafted_run_directory(base_run, capsys, name, pairs):
    run = fresh_copy(base_run)
    with (run / name).open("a" if name.endswith(".jsonl") else "w") as fh:
        fh.write(overlay(RUN_FILES[name], pairs) + "\n")
    code = main(["report", str(run), "-o", str(run / "page.html")])
    no_internal_error(code, capsys.readouterr().err)
    shutil.rmtree(run.parent)


DUMP = {
    "version": "2.10",
    "pg_config": {"0": {"desc": "default_pg", "ranks": "[0, 1]"}},
    "pg_status": {"0": {"last_enqueued_collective": 2, "last_completed_collective": 1}},
    "entries": [
        {"collective_seq_id": 2, "profiling_name": "gloo:all_reduce", "pg_id": 0,
         "process_group": ["0", "default_pg"], "state": "scheduled", "input_sizes": [[4]],
         "input_dtypes": ["Float"], "time_created_ns": 1_700_000_000_000_000_000}
    ],
}  # fmt: skip


@fuzz(12)
@given(overrides, st.sampled_from(["fr_trace_rank_0", "fr_trace_rank_50000000"]))
def test_explain_reads_a_crafted_dump(capsys, pairs, name):
    folder = Path(tempfile.mkdtemp(prefix="fuzz-dump-"))
    (folder / name).write_text(overlay(DUMP, pairs))
    (folder / "fr_trace_rank_1").write_text(json.dumps(DUMP))
    try:
        load_dump(folder / name)
    except DumpError:
        pass
    code = main(["explain", str(folder / name), str(folder / "fr_trace_rank_1")])
    no_internal_error(code, capsys.readouterr().err)
    shutil.rmtree(folder)
