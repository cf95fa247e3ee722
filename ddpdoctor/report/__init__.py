"""A picture of a run: report.html (plotly, self-contained) and Chrome/Perfetto trace JSON.

build_report(run_dir) -> Report          the timeline and the diagnosis of a run directory
Report.html() / Report.trace()           the page and the trace-event document

Sits above the monitor (a run without diagnosis.json is diagnosed from its files).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddpdoctor.monitor.pipeline.postmortem import diagnose_run_dir
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.fr_files import DumpError, load_dump
from ddpdoctor.protocol.fr_requests import answers_dir
from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.report.html import render_html
from ddpdoctor.report.timeline import (
    Timeline,
    add_attempts,
    add_diagnosis_waits,
    add_flight_recorder_waits,
    add_stalls,
    read_timeline,
)
from ddpdoctor.report.trace import trace_events


@dataclass
class Report:
    run: RunDir
    timeline: Timeline
    diagnosis: dict[str, Any]

    @property
    def title(self) -> str:
        return self.run.path.name

    def html(self) -> str:
        return render_html(self.timeline, self.diagnosis, title=self.title)

    def trace(self) -> dict[str, Any]:
        return trace_events(self.timeline, title=self.title)


def build_report(run_dir: str) -> Report:
    """A run directory's report; not a run directory: UsageError (exit 2)."""
    run = RunDir.open(run_dir)
    diagnosis = _diagnosis(run)
    timeline = read_timeline(run)
    add_flight_recorder_waits(timeline, _dumps(run))
    add_diagnosis_waits(timeline, diagnosis)
    add_stalls(timeline, diagnosis)
    add_attempts(timeline, diagnosis)
    return Report(run, timeline, diagnosis)


def _dumps(run: RunDir) -> list:
    """The ranks' latest flight-recorder answers (RUN_DIR/flight_recorder/rank-<R>.json)."""
    folder = answers_dir(run)
    found = []
    for path in sorted(folder.glob("rank-*.json")) if folder.is_dir() else []:
        try:
            found.append(load_dump(path))
        except DumpError:
            continue  # a torn or foreign file: the report goes on without it
    return found


def _diagnosis(run: RunDir) -> dict[str, Any]:
    """The launcher's final diagnosis.json; without one, the post-mortem of the files."""
    try:
        data = jsontext.read(run.diagnosis_json, root=run.path)
        if isinstance(data, dict) and "verdict" in data:
            return data
    except (OSError, ValueError):
        pass
    return diagnose_run_dir(run.path).diagnosis_json()


__all__ = ["Report", "build_report"]
