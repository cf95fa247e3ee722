"""The report's renderers on a timeline built in the test: what a run's text can do to the page
(it is escaped), and the trace-event document's shape (the real run's report and trace are read
in tests/integration/test_postmortem.py)."""

from __future__ import annotations

import json

from ddpdoctor.report.html import render_html
from ddpdoctor.report.timeline import RankTimeline, Span, Timeline
from ddpdoctor.report.trace import trace_events


def timeline() -> Timeline:
    ranks = {
        0: RankTimeline(0, host="node<1>", pid=11, spans=[
            Span(0, "step", "step 1", 100.0, 100.5),
            Span(0, "wait", "all_reduce #6 (never completed)", 100.5, 104.0, {"seq": 6}),
        ], step_times=[(1, 0.5)], last_t=104.0),
        1: RankTimeline(1, spans=[Span(1, "step", "step 1", 100.1, 100.5)],
                        step_times=[(1, 0.4)], last_t=100.5),
    }  # fmt: skip
    return Timeline(ranks=ranks, start=100.0)


def test_text_from_the_run_is_escaped_and_plotly_is_inline():
    diagnosis = {
        "verdict": "hang",
        "culprits": [1],
        "findings": [{"id": "hang", "severity": "error", "summary": "<script>alert(1)</script>",
                      "fix": "a & b", "ranks": [1], "evidence": [{"text": "\x1b]0;x\x07<b>"}]}],
        "stacks": [{"ranks": [0], "frames": ["train.py:3 <module>"]}],
    }  # fmt: skip
    page = render_html(timeline(), diagnosis, title="run <1>")
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)" in page
    assert "a &amp; b" in page and "&lt;b&gt;" in page and "train.py:3 &lt;module&gt;" in page
    assert page.count("<script src=") == 0 and page.count("plotly.js v") >= 1
    assert "run &lt;1&gt;" in page


def test_the_trace_has_one_named_track_per_rank_and_complete_events_in_microseconds():
    document = json.loads(json.dumps(trace_events(timeline(), title="job")))
    events = document["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert tracks == {0: "rank 0 (node<1>, pid 11)", 1: "rank 1"}
    wait = next(e for e in events if e.get("cat") == "wait")
    assert (wait["ph"], wait["tid"], wait["ts"], wait["dur"]) == ("X", 0, 500000.0, 3500000.0)
    assert wait["args"] == {"seq": 6}
