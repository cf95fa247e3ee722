"""A timeline as Chrome / Perfetto trace-event JSON (the "JSON Object Format" of the Trace Event
Format that chrome://tracing and ui.perfetto.dev open).

One process (the job), one track (thread) per rank, named by metadata events ("M":
process_name, thread_name, thread_sort_index); steps, collectives, waits and data waits are
complete events ("X", with ts and dur in microseconds from the run's start) on their rank's
track, their category being the span's kind.
"""

from __future__ import annotations

from typing import Any

from ddpdoctor.report.budget import TRACE_SPANS, thin
from ddpdoctor.report.timeline import Timeline

JOB_PID = 1


def trace_events(timeline: Timeline, *, title: str = "DDP job") -> dict[str, Any]:
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": JOB_PID, "tid": 0, "name": "process_name", "args": {"name": title}}
    ]
    for rank, info in sorted(timeline.ranks.items()):
        where = f" ({info.host}, pid {info.pid})" if info.host and info.pid else ""
        events.append(
            {"ph": "M", "pid": JOB_PID, "tid": rank, "name": "thread_name",
             "args": {"name": f"rank {rank}{where}"}}
        )  # fmt: skip
        events.append(
            {"ph": "M", "pid": JOB_PID, "tid": rank, "name": "thread_sort_index",
             "args": {"sort_index": rank}}
        )  # fmt: skip
    thinned = thin(timeline, TRACE_SPANS, max_points=TRACE_SPANS)
    if thinned.note:
        events[0]["args"]["downsampled"] = thinned.note
    for span in thinned.spans:
        events.append(
            {
                "ph": "X",
                "pid": JOB_PID,
                "tid": span.rank,
                "name": span.name,
                "cat": span.kind,
                "ts": round((span.start - timeline.start) * 1e6, 1),
                "dur": round(span.duration * 1e6, 1),
                "args": span.args,
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}
