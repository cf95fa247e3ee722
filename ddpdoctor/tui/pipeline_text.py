"""The stages × schedule view of a pipeline job: one line per stage, in stage order, with the
rank that runs it, where it is in its schedule (step, action, microbatch) and whom it waits for.
Shown in the diagnosis panel when some rank has recorded a pipeline (ddpdoctor/runtime/
pipeline_hooks.py); nothing otherwise."""

from __future__ import annotations

from rich.text import Text

from ddpdoctor.monitor.model.snapshot import POINT_TO_POINT_OPS, RankState, RankView, Snapshot
from ddpdoctor.tui import fmt

MAX_STAGE_LINES = 16


def _waits_for(view: RankView) -> str:
    coll = view.collective
    if coll is None or view.state.finished:
        return ""
    if coll.op in POINT_TO_POINT_OPS and coll.peers:
        peers = ",".join(map(str, coll.peers))
        return f"{coll.op} #{coll.seq} ↔ rank {peers} {fmt.duration(coll.waiting_s)}"
    return f"{coll.op} #{coll.seq} {fmt.duration(coll.waiting_s)}"


def pipeline_text(snapshot: Snapshot) -> Text | None:
    """The view, or None for a job without a pipeline."""
    stages: list[tuple[int, RankView]] = []
    for view in snapshot.ranks:
        pipe = view.pipeline
        if pipe is None:
            continue
        for stage in pipe.stages or ((pipe.stage,) if pipe.stage is not None else ()):
            stages.append((stage, view))
    if not stages:
        return None
    stages.sort(key=lambda item: (item[0], item[1].rank))
    first = stages[0][1].pipeline
    assert first is not None
    out = Text("\nPipeline", style="bold")
    out.append(
        f"  {first.schedule or '?'} · {first.microbatches or '?'} microbatches · "
        f"{first.num_stages or '?'} stages",
        style="dim",
    )
    for stage, view in stages[:MAX_STAGE_LINES]:
        pipe = view.pipeline
        assert pipe is not None
        culprit = view.rank in snapshot.culprits
        out.append(
            f"\n  stage {stage:>2}  rank {view.rank:>3}  ", style="bold red" if culprit else ""
        )
        out.append(f"{pipe.position():<22}", style="")
        state_style = fmt.state_style(view.state)
        out.append(f"  {fmt.state_label(view.state):<9}", style=state_style)
        waits = _waits_for(view)
        if waits:
            out.append(f"  {waits}", style="dim")
        elif view.state is RankState.STALLED and view.activity is not None and view.activity.where:
            out.append(f"  at {view.activity.where}", style="dim")
    if len(stages) > MAX_STAGE_LINES:
        out.append(f"\n  ... and {len(stages) - MAX_STAGE_LINES} more stages", style="dim")
    return out
