"""The report's budget: a long run's page shows one step in k of each rank, keeps every wait
that never completed and every stall whole, and says so; a long events file is read at both
ends, and nothing is drawn across the part left out."""

from __future__ import annotations

import json

from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.report import budget, html, timeline
from ddpdoctor.report import trace as trace_module
from ddpdoctor.report.budget import thin
from ddpdoctor.report.timeline import RankTimeline, Span, Timeline, read_timeline
from ddpdoctor.report.trace import trace_events


def long_timeline(ranks: int, steps: int) -> Timeline:
    by_rank = {}
    for rank in range(ranks):
        info = RankTimeline(rank=rank)
        for step in range(steps):
            t = step * 0.1
            info.spans.append(Span(rank, "step", f"step {step}", t, t + 0.1, {"step": step}))
            info.spans.append(Span(rank, "data", "data", t, t + 0.01, {"step": step}))
            info.step_times.append((step, 0.1))
        info.spans.append(Span(rank, "wait", "all_reduce #9 (never completed)", 99.0, 100.0))
        by_rank[rank] = info
    return Timeline(ranks=by_rank, start=0.0)


def test_a_short_run_is_drawn_whole():
    thinned = thin(long_timeline(2, 50), max_spans=1000)
    assert thinned.every == 1 and thinned.note is None and len(thinned.spans) == 2 * 101


def test_a_long_run_shows_one_step_in_k_and_keeps_every_wait():
    whole = long_timeline(8, 1000)
    thinned = thin(whole, max_spans=2000, max_points=2000)
    assert len(thinned.spans) <= 2000
    assert sum(len(points) for points in thinned.step_times.values()) <= 2000
    assert sum(s.kind == "wait" for s in thinned.spans) == 8  # every rank's wait, whole
    steps = {s.args["step"] for s in thinned.spans if s.kind == "step"}
    assert steps == set(range(0, 1000, thinned.every))
    assert thinned.note and f"one step in {thinned.every}" in thinned.note


def test_the_page_and_the_trace_say_they_were_thinned(monkeypatch):
    monkeypatch.setattr(html, "PAGE_SPANS", 300)
    monkeypatch.setattr(budget, "PAGE_POINTS", 300)
    whole = long_timeline(2, 400)
    page = html.render_html(whole, {"verdict": "healthy"}, title="long")
    assert 'id="downsampled"' in page and "one step in" in page
    monkeypatch.setattr(trace_module, "TRACE_SPANS", 300)
    events = trace_events(whole)["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) <= 300
    assert "one step in" in events[0]["args"]["downsampled"]


def test_a_long_events_file_is_read_at_both_ends_with_nothing_across_the_gap(tmp_path, monkeypatch):
    monkeypatch.setattr(timeline, "READ_BUDGET_BYTES", 20_000)
    monkeypatch.setattr(timeline, "MIN_READ_PER_RANK", 20_000)
    run = RunDir.create(tmp_path / "run")
    lines = []
    for step in range(1000):
        t = 1000.0 + step
        call = {"op": "all_reduce", "seq": step, "group": "default"}
        lines.append({"v": 1, "t": t, "mono": t, "rank": 0, "kind": "collective_start", **call})
        lines.append({"v": 1, "t": t + 0.5, "mono": t, "rank": 0, "kind": "collective_end", **call})
    run.events_file(0).write_text("\n".join(json.dumps(e) for e in lines) + "\n")
    read = read_timeline(run)
    assert read.skipped == (0,)
    spans = read.ranks[0].spans
    assert spans and all(s.kind == "collective" for s in spans)  # no "never completed" wait
    assert min(s.start for s in spans) == 1000.0 and max(s.end for s in spans) == 1999.5
    assert "the middle is left out" in (thin(read, max_spans=10_000).note or "")
