"""torch.distributed.pipelining: each rank's stages and schedule, its position in the schedule,
and the pipeline's contract compared across ranks before the first step.

A pipeline schedule is a program each rank builds for itself: the schedule class, the number of
microbatches and the number of stages must agree on every rank, or the stages send tensors of
one size to neighbours that expect another (a `PipeliningShapeError` on whichever stage notices,
or a send nobody receives). So:

- `_PipelineStageBase.__init__` is wrapped to remember the user's line that made the stage.
- The schedule's `__init__` (the base class, which every schedule calls first) remembers the
  user's line that built the schedule (one frame walk per schedule, at build time).
- The first `step()` of a schedule writes a `pipeline` event (schedule, microbatches, stages,
  this rank's stage indices, both lines) and compares the contract across the pipeline's ranks
  (fingerprint.py, label `pipeline<n>`), then the shapes each stage declared it sends against
  those its next stage declared it receives (pipeline_shapes.py, pairwise): a difference is a
  `warning` of code `pipeline.contract_mismatch`, written before the step sends anything.
- Each `step()` counts the rank's pipeline steps, and each stage's forward and backward of a
  microbatch sets the rank's position (step, action, microbatch, stage): a list the heartbeat
  thread reports, updated in place (no event, no allocation but a small list per microbatch).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from ddpdoctor.protocol.events import PIPELINE, WARNING
from ddpdoctor.runtime import core, fingerprint, pipeline_shapes
from ddpdoctor.runtime.import_hooks import when_imported
from ddpdoctor.runtime.patching import WRAPPED_MARK, patch

CODE = "pipeline.contract_mismatch"
STAGE_SITE = "_ddpdoctor_stage_site"  # on a stage: fingerprint.Where of the line that made it
SCHEDULE_SITE = "_ddpdoctor_schedule_site"  # on a schedule: the line that built it
STEPS = "_ddpdoctor_steps"  # on a schedule: how many step() calls it has begun


class _Depth(threading.local):
    depth = 0  # step() of a subclass calling its parent's: counted once


_DEPTH = _Depth()


def stages_of(schedule: Any) -> list[Any]:
    stages = getattr(schedule, "_stages", None)
    if stages is None:
        stage = getattr(schedule, "_stage", None)
        stages = [stage] if stage is not None else []
    return list(stages)


def contract_of(schedule: Any) -> tuple[list[fingerprint.Entry], dict[str, Any]]:
    """(the entries every rank must share, this rank's facts for the `pipeline` event)."""
    where = schedule.__dict__.get(SCHEDULE_SITE)
    stages = stages_of(schedule)
    stage_where = stages[0].__dict__.get(STAGE_SITE) if stages else None
    n_micro = getattr(schedule, "_n_microbatches", None)
    num_stages = getattr(stages[0], "num_stages", None) if stages else None
    name = type(schedule).__name__
    entries: list[fingerprint.Entry] = [
        ("schedule", name, where),
        ("microbatches", str(n_micro), where),
        ("stages", str(num_stages), stage_where),
        ("stages per rank", str(len(stages)), where),
    ]
    facts: dict[str, Any] = {
        "schedule": name,
        "microbatches": n_micro,
        "num_stages": num_stages,
        "stages": [getattr(s, "stage_index", None) for s in stages],
        "site": _site(where),
        "stage_site": _site(stage_where),
    }
    return entries, facts


def _site(where: fingerprint.Where | None) -> dict[str, Any] | None:
    if where is None:
        return None
    return {"file": where[0], "line": where[1], "function": where[2]}


def members_of(schedule: Any) -> list[int] | None:
    """The global ranks of the pipeline's group (None: the whole world)."""
    from ddpdoctor.runtime.c10d_hooks import GROUPS

    stages = stages_of(schedule)
    group = getattr(stages[0], "group", None) if stages else None
    info = GROUPS.describe(group) if group is not None else None
    if info is None or info.ranks is None:
        return None
    return sorted(info.ranks)


def first_step(rt: core.Runtime, schedule: Any) -> None:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    entries, facts = contract_of(schedule)
    rt.emit(PIPELINE, **facts)
    if not dist.is_initialized():
        return
    rank = dist.get_rank()
    members = members_of(schedule) or list(range(dist.get_world_size()))
    if rank not in members:
        return
    label = fingerprint.next_label("pipeline")
    if len(members) != dist.get_world_size():  # pipelines of other groups compare apart
        label += "/g" + ",".join(map(str, members))[:64]
    where = schedule.__dict__.get(SCHEDULE_SITE)
    title = f"the pipeline schedule built at {fingerprint.place(where)}"
    store = c10d._get_default_store()
    message = fingerprint.exchange_on(store, rank, members, label, title, entries, rt.wall_clock())
    if message is not None:
        _warn(rt, label, message.replace("SPMD contract", "pipeline contract", 1))
        return  # the schedules differ: the shapes that follow from it would only repeat that
    sides = pipeline_shapes.sides_of(
        stages_of(schedule), rank, lambda stage: stage.__dict__.get(STAGE_SITE)
    )
    for shapes in pipeline_shapes.compare_on(store, label, title, sides, rt.wall_clock()):
        _warn(rt, label, shapes)


def _warn(rt: core.Runtime, label: str, message: str) -> None:
    named = message.rpartition("[culprits ")[2].partition(";")[0].split(",")
    culprits = [int(r) for r in named if r.isdigit()]
    rt.emit(WARNING, code=CODE, message=message, details={"label": label, "culprits": culprits})


def _wrap_init(runtime: core.Runtime, cls: Any, attr: str) -> None:
    original = vars(cls).get("__init__")
    if original is None or hasattr(original, WRAPPED_MARK):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if core._active is not None and attr not in self.__dict__:
            self.__dict__[attr] = fingerprint.caller(1)
        original(self, *args, **kwargs)

    patch(runtime, cls, "__init__", __init__, original)


def _wrap_step(runtime: core.Runtime, cls: Any) -> None:
    original = vars(cls).get("step")
    if original is None or hasattr(original, WRAPPED_MARK):
        return

    @functools.wraps(original)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = core._active
        if rt is None or _DEPTH.depth:
            return original(self, *args, **kwargs)
        n = self.__dict__.get(STEPS, 0) + 1
        self.__dict__[STEPS] = n
        if n == 1:
            try:
                first_step(rt, self)
            except Exception:  # noqa: BLE001
                pass
        rt.pipeline_position = [n, "step", None, None]
        if getattr(self, "_has_backward", False):
            try:  # a step of a schedule with a loss trains: it is the rank's training step
                rt.steps.on_forward(rt.mono_clock(), True, True, _batch_size(args))
            except Exception:  # noqa: BLE001
                pass
        _DEPTH.depth += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _DEPTH.depth -= 1

    patch(runtime, cls, "step", step, original)


def _batch_size(args: tuple[Any, ...]) -> int | None:
    shape = getattr(args[0], "shape", None) if args else None
    return int(shape[0]) if shape else None


def _wrap_chunk(runtime: core.Runtime, cls: Any, name: str, action: str) -> None:
    original = vars(cls).get(name)
    if original is None or hasattr(original, WRAPPED_MARK):
        return

    @functools.wraps(original)
    def one_chunk(self: Any, chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        rt = core._active
        if rt is not None:
            position = rt.pipeline_position
            step = position[0] if position is not None else None
            rt.pipeline_position = [step, action, chunk_id, getattr(self, "stage_index", None)]
        return original(self, chunk_id, *args, **kwargs)

    patch(runtime, cls, name, one_chunk, original)


def install_pipelining(runtime: core.Runtime) -> None:
    from torch.distributed.pipelining import schedules, stage

    _wrap_init(runtime, stage._PipelineStageBase, STAGE_SITE)
    _wrap_init(runtime, schedules._PipelineSchedule, SCHEDULE_SITE)
    for cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
        _wrap_step(runtime, cls)
    base = stage._PipelineStageBase
    for name, action in (
        ("forward_one_chunk", "F"),
        ("backward_one_chunk", "B"),
        ("backward_weight_one_chunk", "W"),
    ):
        _wrap_chunk(runtime, base, name, action)


def install(runtime: core.Runtime) -> None:
    """Hook torch.distributed.pipelining once the script imports it (now, if it has)."""

    def imported(_module: Any) -> None:
        if core.active() is runtime:
            install_pipelining(runtime)

    when_imported("torch.distributed.pipelining", imported)
