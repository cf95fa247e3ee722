"""Hot-path events as tuples: built in a few bytecodes on the training thread, encoded later.

A collective or a step happens many times a second, so the training thread does not build a dict
and a JSON text for it: it records a tuple `(encoder, t, mono, ...)` with the raw values, and the
writer thread (ddpdoctor/runtime/writer.py) calls `encoder(record, rank)` to get the JSON line.
The parts of a line that do not change from call to call (a gradient bucket's op, group, shape and
dtype) are encoded once, when a `CollectiveDesc` is made, and reused as text.

Every encoder writes the same object `ddpdoctor.protocol.events.encode_event` would write for the event
(same envelope, same fields, same values); only the order of the fields may differ.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from ddpdoctor.protocol.events import (
    COLLECTIVE_END,
    COLLECTIVE_START,
    METRICS,
    SCHEMA_VERSION,
    STEP,
)

# A record: (encoder, t, mono, *payload); encoder(record, rank) -> one line of JSON, no newline.
Record = tuple[Any, ...]
Encoder = Callable[[Record, int], str]

_JSON = json.JSONEncoder(separators=(",", ":"), default=str, ensure_ascii=False)


def text(value: Any) -> str:
    """A value as JSON text (for the parts encoded once)."""
    return _JSON.encode(value)


def fields_text(fields: dict[str, Any]) -> str:
    """`"a":1,"b":[2]`: the members of a JSON object, to splice into a line."""
    return _JSON.encode(fields)[1:-1]


def _envelope(kind: str) -> str:
    """The envelope's text up to the kind, as a template for `template % (t, mono, rank)`."""
    return '{"v":' + str(SCHEMA_VERSION) + ',"t":%r,"mono":%r,"rank":%d,"kind":' + text(kind)


_START = _envelope(COLLECTIVE_START)
_END = _envelope(COLLECTIVE_END)
_METRICS = _envelope(METRICS)
# A step's line as one template (the kind has no "%"). Its times to the microsecond ("%.6f"):
# repr() of a unix time (17 digits) took half of the encoding, which runs once per step on the
# writer thread with the GIL held; a microsecond is finer than any step.
_STEP_HEAD = (
    '{"v":' + str(SCHEMA_VERSION) + ',"t":%.6f,"mono":%.6f,"rank":%d,"kind":' + text(STEP)
) + ',"step":%d,"epoch":%s,"loss":%s,"batch_size":%s,"forwards":%d,"step_time_s":%.6f,'
_STEP_LINE = _STEP_HEAD + (
    '"data_time_s":%.6f,"compute_time_s":%.6f,"comm_wait_s":%.6f,"samples_per_s":%s}'
)
# before DDP's timers are first read: no split of the rest (steps.ddp_comm_s None)
_STEP_LINE_UNSPLIT = _STEP_HEAD + (
    '"data_time_s":%.6f,"compute_time_s":null,"comm_wait_s":null,"samples_per_s":%s}'
)


class CollectiveDesc:
    """One kind of call as its events describe it, with its constant parts encoded once.

    The DDP hook keeps one per gradient bucket (its shape and dtype stay put from step to step);
    the torch.distributed hooks keep one per distinct call (op, group, shapes, dtypes, ...)."""

    __slots__ = (
        "bucket",
        "end_tail",
        "group",
        "group_text",
        "immediate",
        "is_async",
        "on_gpu",
        "op",
        "op_text",
        "p2p",
        "parts",
        "peer",
        "seq_key",
        "start_tail",
    )

    def __init__(
        self,
        op: str,
        group: Any,  # collectives.GroupInfo
        tensors: Any,  # collectives.TensorSummary
        *,
        is_async: bool,
        bucket: int | None = None,
        p2p: bool = False,
        peer: int | None = None,
        tag: int | None = None,
        parts: tuple[tuple[str, int, int], ...] = (),
    ) -> None:
        self.op = op
        self.group = group
        self.on_gpu = bool(tensors.on_gpu)
        self.bucket = bucket
        self.is_async = is_async
        self.p2p = p2p
        self.peer = peer
        self.parts = parts  # batch_isend_irecv: (op, peer, tag) of its ops
        # Point-to-point ops count per group and peer, apart from the collectives' numbers.
        self.seq_key: Any = (group.name, "p2p", peer) if p2p else group.name
        # Every collective but a gradient bucket is written before it is entered: the start of
        # the call a rank dies in (gloo aborts on a size mismatch) must be on disk.
        self.immediate = bucket is None
        self.op_text = text(op)
        self.group_text = text(group.name)
        start: dict[str, Any] = {
            "group": group.name,
            "group_size": group.size,
            "group_ranks": list(group.ranks) if group.ranks is not None else None,
            "shapes": [list(s) for s in tensors.shapes],
            "dtypes": list(tensors.dtypes),
            "numel": tensors.numel,
            "async": is_async,
        }
        peer_fields = {"p2p": True, "peer": peer} if p2p else {}
        if bucket is not None:
            start["bucket"] = bucket
        start.update(peer_fields)
        if tag:
            start["tag"] = tag
        if parts:
            start["p2p_ops"] = [list(part) for part in parts]
        self.start_tail = fields_text(start)
        self.end_tail = "," + fields_text(peer_fields) if p2p else ""


def collective_start(record: Record, rank: int) -> str:
    """`site` (call_sites.py: the user's line and the framework frames that issued the call) is
    JSON text made once per distinct site, or None (a gradient bucket, no user frame); `step`
    the training step it was made in (0: none yet, left out)."""
    _, t, mono, desc, seq, site, step = record
    line = f'{_START % (t, mono, rank)},"op":{desc.op_text},"seq":{seq},{desc.start_tail}'
    if step:
        line = f'{line},"step":{step}'
    return f"{line},{site}}}" if site else line + "}"


def collective_end(record: Record, rank: int) -> str:
    _, t, mono, desc, seq, duration, error, via = record
    status = '"ok":true,"error":null' if error is None else f'"ok":false,"error":{text(error)}'
    return (
        f'{_END % (t, mono, rank)},"op":{desc.op_text},"seq":{seq},'
        f'"group":{desc.group_text},"duration_s":{duration if duration > 0.0 else 0.0:.6f},'
        f'{status},"via":"{via}"{desc.end_tail}}}'
    )


def step(record: Record, rank: int) -> str:
    """A closed step; the split of its wall time is worked out here, off the training thread."""
    _, t, mono, number, epoch, loss, samples, forwards, step_time, data_s, comm_s = record
    # seconds to the microsecond, as numbers: "0.001200" reads back as 0.0012
    step_time = step_time if step_time > 0.0 else 0.0
    data = data_s if data_s < step_time else step_time
    if loss is None:
        loss_text = "null"
    elif math.isfinite(loss):
        loss_text = repr(float(loss))
    else:  # as api.log writes a non-finite value
        loss_text = f'"{loss}"'
    rate = "%.3f" % (samples / step_time) if samples and step_time > 0.0 else "null"
    epoch_text = "null" if epoch is None else int(epoch)
    # one %-format of one template: a third cheaper than an f-string of parts (this runs per step)
    if comm_s is None:  # DDP's timers not read yet: no split of the rest
        return _STEP_LINE_UNSPLIT % (
            t, mono, rank, number, epoch_text, loss_text, samples or "null", forwards,
            step_time, data, rate,
        )  # fmt: skip
    comm = comm_s if comm_s < step_time else step_time
    compute = step_time - data - comm
    return _STEP_LINE % (
        t, mono, rank, number, epoch_text, loss_text, samples or "null", forwards,
        step_time, data, compute if compute > 0.0 else 0.0, comm, rate,
    )  # fmt: skip


def metrics(record: Record, rank: int) -> str:
    """ddpdoctor.log(...): values already made JSON-friendly (api.plain), names already safe."""
    _, t, mono, values = record
    if not values:
        return _METRICS % (t, mono, rank) + "}"
    return f"{_METRICS % (t, mono, rank)},{fields_text(values)}}}"


def encode(record: Record, rank: int) -> str:
    return record[0](record, rank)


def as_event(record: Record, rank: int = 0) -> dict[str, Any]:
    """The event a record stands for, as a reader will see it (for tests and tools)."""
    return json.loads(encode(record, rank))
