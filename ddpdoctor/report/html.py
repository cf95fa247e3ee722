"""report.html: one self-contained page about a run (no network: plotly.js is inlined once).

The verdict and its findings (diagnosis.json), a per-rank timeline of steps, collectives, waits
and data waits, step time per rank, and the stacks the monitor took. Every string from the run
(findings, stack frames, hosts) is HTML-escaped; plotly escapes what it draws.
"""

from __future__ import annotations

import html
import math
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from ddpdoctor.rank_ranges import named_ranks
from ddpdoctor.report.budget import PAGE_SPANS, thin
from ddpdoctor.report.timeline import Span, Timeline

# kind: (legend name, colour)
KINDS = {
    "attempt": ("attempt (a launcher's restart begins the next)", "#fee6ce"),  # drawn first: under
    "step": ("step", "#9ecae1"),
    "data": ("data wait", "#fdae6b"),
    "collective": ("collective", "#31a354"),
    "wait": ("waiting in a collective (never completed)", "#de2d26"),
    "stalled": ("no progress (hang culprit)", "#756bb1"),
}
VERDICT_COLOURS = {"healthy": "#31a354", "running": "#3182bd"}
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.verdict { display: inline-block; padding: .25em .8em; border-radius: .3em; color: #fff;
           font-weight: bold; text-transform: uppercase; }
.finding { border-left: 4px solid #de2d26; padding: .3em .8em; margin: .6em 0; background: #fafafa; }
.finding.warning { border-color: #fd8d3c; } .finding.info { border-color: #3182bd; }
.finding .summary { font-weight: 600; } .finding .fix { margin-top: .3em; }
.evidence { font-family: ui-monospace, monospace; font-size: .85em; color: #444; white-space: pre-wrap; }
pre { background: #f4f4f4; padding: .6em; overflow-x: auto; font-size: .85em; }
.meta { color: #666; }
"""


def render_html(timeline: Timeline, diagnosis: dict[str, Any], *, title: str) -> str:
    thinned = thin(timeline, PAGE_SPANS)
    figures = [_timeline_figure(timeline, thinned.spans), _step_figure(thinned.step_times)]
    charts = []
    for n, fig in enumerate(figures):
        charts.append(
            pio.to_html(
                fig,
                full_html=False,
                include_plotlyjs=n == 0,  # the library once, inline: no network
                config={"displaylogo": False},
                default_height="auto",
            )
        )
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>",
            f"<h1>ddpdoctor report: {_e(title)}</h1>",
            _verdict(diagnosis),
            f'<p class="meta" id="downsampled">{_e(thinned.note)}</p>' if thinned.note else "",
            _findings(diagnosis),
            "<h2>Timeline per rank</h2>",
            '<p class="meta">Steps, collectives, data waits and collectives that never '
            "completed, per rank, in seconds from the run's first event. Drag to zoom, "
            "double-click to reset.</p>",
            charts[0],
            "<h2>Step time per rank</h2>",
            charts[1],
            _stacks(diagnosis),
            "</body></html>",
        ]
    )


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


# diagnosis.json may come from anywhere: each field is used only when it has its type
def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value[:MAX_ITEMS] if isinstance(value, list) else []


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


MAX_ITEMS = 1000  # findings, ranks, stacks or frames shown from one list


def _verdict(diagnosis: dict[str, Any]) -> str:
    verdict = str(diagnosis.get("verdict") or "unknown")
    colour = VERDICT_COLOURS.get(verdict, "#de2d26")
    after = diagnosis.get("detected_after_s")
    detail = f" detected after {after:.1f} s" if _number(after) else ""
    run = _dict(diagnosis.get("run"))
    meta = ", ".join(
        f"{k} {_e(v)}"
        for k, v in (("world size", run.get("world_size")), ("backend", run.get("backend")))
        if v is not None
    )
    culprits = [c for c in _list(diagnosis.get("culprits")) if isinstance(c, int)]
    who = f"; culprit ranks: {_e(', '.join(str(c) for c in culprits))}" if culprits else ""
    return (
        f'<p id="verdict"><span class="verdict" style="background:{colour}">{_e(verdict)}</span>'
        f'<span class="meta">{_e(detail)}{who}{"; " + meta if meta else ""}</span></p>'
    )


def _findings(diagnosis: dict[str, Any]) -> str:
    items = []
    for f in _list(diagnosis.get("findings")):
        if not isinstance(f, dict):
            continue
        severity = str(f.get("severity", "info"))
        ranks = _list(f.get("ranks"))
        evidence = [e.get("text", "") for e in _list(f.get("evidence")) if isinstance(e, dict)]
        items.append(
            f'<div class="finding {_e(severity)}" data-id="{_e(f.get("id", ""))}">'
            f'<div class="summary">{_e(severity)}: {_e(f.get("summary", ""))}'
            f"{' (' + _e(named_ranks(r for r in ranks if isinstance(r, int))) + ')' if ranks else ''}"
            "</div>"
            f'<div class="fix">Fix: {_e(f.get("fix", ""))}</div>'
            + (f'<div class="evidence">{_e(chr(10).join(evidence[:12]))}</div>' if evidence else "")
            + "</div>"
        )
    body = "\n".join(items) if items else "<p>No findings.</p>"
    return f'<h2>Findings</h2><div id="findings">{body}</div>'


def _stacks(diagnosis: dict[str, Any]) -> str:
    parts = []
    for group in _list(diagnosis.get("stacks")):
        if not isinstance(group, dict):
            continue
        ranks = [r for r in _list(group.get("ranks")) if isinstance(r, int)]
        frames = "\n".join(str(f) for f in _list(group.get("frames")))
        parts.append(f"<h3>{_e(named_ranks(ranks))}</h3><pre>{_e(frames)}</pre>")
    if not parts:
        return "<h2>Stacks</h2><p>No stacks were taken.</p>"
    return '<h2>Stacks</h2><div id="stacks">' + "\n".join(parts) + "</div>"


def _timeline_figure(timeline: Timeline, drawn: list[Span]) -> go.Figure:
    fig = go.Figure()
    rows = [f"rank {r}" for r in sorted(timeline.ranks)]
    for kind, (label, colour) in KINDS.items():
        spans = [s for s in drawn if s.kind == kind]
        if not spans:
            continue
        fig.add_trace(
            go.Bar(
                name=label,
                orientation="h",
                y=[f"rank {s.rank}" for s in spans],
                x=[max(s.duration, 1e-4) for s in spans],
                base=[s.start - timeline.start for s in spans],
                marker_color=colour,
                opacity={"step": 0.55, "attempt": 0.5}.get(kind, 0.9),
                width={"step": 0.8, "attempt": 0.95}.get(kind, 0.45),
                hovertext=[f"{s.name}: {s.duration:.3f} s" for s in spans],
                hoverinfo="text",
            )
        )
    fig.update_layout(
        barmode="overlay",
        height=160 + 60 * max(1, len(rows)),
        xaxis_title="seconds since the run's first event",
        yaxis={"categoryorder": "array", "categoryarray": list(reversed(rows))},
        margin={"l": 70, "r": 20, "t": 30, "b": 40},
        legend={"orientation": "h", "y": 1.15},
    )
    return fig


def _step_figure(step_times: dict[int, list[tuple[int, float]]]) -> go.Figure:
    fig = go.Figure()
    for rank, points in sorted(step_times.items()):
        if points:
            steps, seconds = zip(*points, strict=True)
            fig.add_trace(go.Scatter(name=f"rank {rank}", x=steps, y=seconds, mode="lines+markers"))
    fig.update_layout(
        height=320,
        xaxis_title="step",
        yaxis_title="step time (s)",
        margin={"l": 70, "r": 20, "t": 30, "b": 40},
    )
    return fig
