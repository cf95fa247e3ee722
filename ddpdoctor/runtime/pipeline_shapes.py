"""The shapes in the pipeline contract: what a stage says it sends to the next stage, against
what that stage says it receives, compared before the first step.

A stage built with example tensors (`PipelineStage(..., input_args=, output_args=)`, torch's
static mode) fixes the buffers it receives into and the gradients it expects back; nothing in
torch compares them with its neighbour's: a receiver that declared the whole batch where one
microbatch comes fails later in its loss or backward, a sender that declared another size gets
gradients of another size back, and on NCCL a receive of another size hangs or reads garbage.
Each boundary between stage s and s+1 has two sides, one per stage, and the stages are usually
on two ranks, so the comparison is pairwise, never over the whole pipeline:

    ddpdoctor/pipeline_shapes/<label>/<s>/out   stage s's declared outputs (its rank, its line)
    ddpdoctor/pipeline_shapes/<label>/<s>/in    stage s+1's declared inputs
    ddpdoctor/pipeline_shapes/<label>/<s>/n     how many sides have arrived (store.add)

The second side to arrive compares; no rank waits for another. A side whose stage declared
nothing (its shapes inferred from the first microbatch, consistent by construction) compares
nothing. Two stages on one rank (interleaved schedules) are compared in the process.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ddpdoctor.runtime import fingerprint
from ddpdoctor.runtime.collectives import dtype_name

PREFIX = "ddpdoctor/pipeline_shapes/"
Side = tuple[int, "str | None", "fingerprint.Where | None"]  # (rank, declared shapes, line)


def metas_text(metas: Sequence[Any] | None) -> str | None:
    """`[4, 24] float32, [4] int64` for a stage's declared tensors (None: none declared)."""
    if metas is None:
        return None
    parts: list[str] = []
    for meta in metas:
        shape = getattr(meta, "shape", None)
        if shape is None:
            return None  # a declaration this code does not understand is not compared
        parts.append(f"{fingerprint.shape_text(shape)} {dtype_name(getattr(meta, 'dtype', None))}")
    return ", ".join(parts)[: fingerprint.MAX_VALUE]


def declared(stage: Any) -> tuple[str | None, str | None]:
    """(inputs, outputs) the user declared for a stage: torch >= 2.12 keeps them apart from
    what it infers (`_user_meta`); older versions set `inputs_meta` / `_outputs_meta` from the
    example tensors at construction, before any step infers them."""
    user = getattr(stage, "_user_meta", None)
    if user is not None:
        return metas_text(getattr(user, "inputs", None)), metas_text(getattr(user, "outputs", None))
    inputs = stage.__dict__.get("inputs_meta") if hasattr(stage, "__dict__") else None
    outputs = stage.__dict__.get("_outputs_meta") if hasattr(stage, "__dict__") else None
    return metas_text(inputs), metas_text(outputs)


def sides_of(stages: Sequence[Any], rank: int, where_of: Any) -> dict[tuple[int, str], Side]:
    """This rank's sides of the boundaries its stages touch: (boundary s, "out"|"in") ->
    (rank, declared shapes, the line that made the stage)."""
    out: dict[tuple[int, str], Side] = {}
    for stage in stages:
        index, count = getattr(stage, "stage_index", None), getattr(stage, "num_stages", None)
        if not isinstance(index, int) or not isinstance(count, int):
            continue
        inputs, outputs = declared(stage)
        where = where_of(stage)
        if index > 0:
            out[(index - 1, "in")] = (rank, inputs, where)
        if index < count - 1:
            out[(index, "out")] = (rank, outputs, where)
    return out


def difference(boundary: int, sender: Side, receiver: Side, title: str, now: float) -> str | None:
    """The contract message when both sides declared their shapes and they differ (the SPMD
    contract's form, `[culprits A,B; line FILE:LINE; t T]`): both stages are named, as nothing
    before the first step tells which declaration is wrong."""
    (s_rank, sent, s_where), (r_rank, expected, r_where) = sender, receiver
    if sent is None or expected is None or sent == expected:
        return None
    culprits = sorted({s_rank, r_rank})
    line = s_where or r_where
    cite = f"; line {line[0]}:{line[1]}" if line else ""
    return (
        f"the ranks differ in the pipeline contract of {title}: stage {boundary} (rank {s_rank}) "
        f"sends {sent} (made at {fingerprint.place(s_where)}), stage {boundary + 1} (rank "
        f"{r_rank}) expects {expected} (made at {fingerprint.place(r_where)}) (nothing before "
        f"the first step tells which declaration is wrong: both named) "
        f"[culprits {','.join(map(str, culprits))}{cite}; t {now:.3f}]"
    )


def _encode(side: Side) -> str:
    return json.dumps([side[0], side[1], list(side[2]) if side[2] else None])


def _decode(raw: bytes) -> Side | None:
    try:
        rank, text, where = json.loads(raw)
        place = (str(where[0]), int(where[1]), str(where[2])) if where else None
        return int(rank), (str(text) if text is not None else None), place
    except Exception:  # noqa: BLE001 - a side that cannot be read is not compared
        return None


def compare_on(
    store: Any, label: str, title: str, sides: dict[tuple[int, str], Side], now: float
) -> list[str]:
    """Publish this rank's sides and compare each boundary whose other side is already there
    (or on this rank). The messages of the boundaries that differ."""
    messages: list[str] = []
    for (boundary, kind), side in sorted(sides.items()):
        other_kind = "in" if kind == "out" else "out"
        mine_both = (boundary, other_kind) in sides
        if mine_both:
            if kind == "out":  # both stages here: once, from the sender's side
                message = difference(boundary, side, sides[(boundary, "in")], title, now)
                messages += [message] if message else []
            continue
        key = f"{PREFIX}{label}/{boundary}/"
        store.set(key + kind, _encode(side))
        if int(store.add(key + "n", 1)) != 2:
            continue  # the first side: the other compares when it arrives
        other = _decode(store.get(key + other_kind))
        if other is None:
            continue
        sender, receiver = (side, other) if kind == "out" else (other, side)
        message = difference(boundary, sender, receiver, title, now)
        messages += [message] if message else []
    return messages
