"""A pipeline rank as the monitor shows it: its schedule and stages (the `pipeline` event) and
where it is in the schedule (the heartbeat's `pipeline` position)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_STAGES = 64  # stage indices kept per rank


@dataclass(frozen=True)
class PipelineView:
    schedule: str | None = None  # the schedule's class: "ScheduleGPipe", "Schedule1F1B", ...
    microbatches: int | None = None
    num_stages: int | None = None
    stages: tuple[int, ...] = ()  # this rank's stage indices
    step: int | None = None  # its schedule step() in progress (1 = the first)
    action: str | None = None  # "F" (forward), "B" (backward), "W" (weight grad), "step"
    microbatch: int | None = None
    stage: int | None = None  # the stage the action runs

    def position(self) -> str:
        """ "step 6 F3 (stage 1)": where the rank is in its schedule."""
        if self.step is None and self.action is None:
            return "-"
        parts = [f"step {self.step}" if self.step is not None else "step ?"]
        if self.action in ("F", "B", "W"):
            mb = "?" if self.microbatch is None else str(self.microbatch)
            parts.append(f"{self.action}{mb}")
        if self.stage is not None:
            parts.append(f"(stage {self.stage})")
        return " ".join(parts)

    def stage_text(self) -> str:
        """ "stage 1/2" or "stages 0,2/4"."""
        total = "?" if self.num_stages is None else str(self.num_stages)
        if not self.stages:
            return f"stage ?/{total}"
        word = "stage" if len(self.stages) == 1 else "stages"
        return f"{word} {','.join(map(str, self.stages))}/{total}"

    def to_json(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "num_stages": self.num_stages,
            "stages": list(self.stages),
            "step": self.step,
            "action": self.action,
            "microbatch": self.microbatch,
            "stage": self.stage,
        }


def integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def text(value: Any) -> str | None:
    return value[:64] if isinstance(value, str) and value else None


def ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(v for v in value[:MAX_STAGES] if integer(v) is not None)


def from_event(e: dict[str, Any], before: PipelineView | None) -> PipelineView:
    """The `pipeline` event (a schedule's first step) read into the rank's view."""
    stages = ints(e.get("stages"))
    return PipelineView(
        schedule=text(e.get("schedule")),
        microbatches=integer(e.get("microbatches")),
        num_stages=integer(e.get("num_stages")),
        stages=stages[:MAX_STAGES],
        step=before.step if before else None,
        action=before.action if before else None,
        microbatch=before.microbatch if before else None,
        stage=before.stage if before else None,
    )


def with_position(value: Any, before: PipelineView | None) -> PipelineView | None:
    """A heartbeat's `pipeline` position ([step, action, microbatch, stage]) applied."""
    if not isinstance(value, list) or len(value) != 4:
        return before
    step, action, microbatch, stage = value
    base = before or PipelineView()
    position = (integer(step), text(action), integer(microbatch), integer(stage))
    if position == (base.step, base.action, base.microbatch, base.stage):
        return base
    return PipelineView(base.schedule, base.microbatches, base.num_stages, base.stages, *position)
