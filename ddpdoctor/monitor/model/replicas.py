"""Replica digests as the monitor keeps them: per rank, per DDP model, by step.

A rank writes a `replica_digest` event now and then (ddpdoctor/runtime/replicas.py): the step,
the bit-sum of each parameter (and of each buffer, at a forward where DDP had just broadcast
them), the tensors' names when they changed since its last digest, and the calls that wrote the
replica outside the optimizer (runtime/replica_calls.py) counted so far. Everything is checked as
it is read (a digest with a value of the wrong type is dropped, never half-believed).

Bounded: a rank keeps at most MAX_KEPT digests per model. When more come, the ones whose step is
not a multiple of a doubled stride are dropped (the most recent KEEP_RECENT always stay), the
same steps on every rank, so the ranks still share steps to compare: the window in which the
replicas started to differ only widens, and the calls narrow it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddpdoctor.monitor.model.event_fields import call_site, integer, num, text
from ddpdoctor.monitor.model.snapshot import CallSite

MAX_KEPT = 256
KEEP_RECENT = 32
MAX_MODELS = 8
MAX_TENSORS = 100_000  # per digest (a model with more tensors than this is not compared)
MAX_CALLS = 64
MAX_PEERS = 65_536
KINDS = ("ddp", "hsdp", "zero")


@dataclass(frozen=True)
class ReplicaCall:
    """A call that wrote the replica outside the optimizer, as one rank counted it."""

    what: str  # "DistributedDataParallel.load_state_dict", "StepLR.step", "SGD.step"
    site: CallSite | None
    ddp: bool  # it wrote into the DDP model (or its optimizer / scheduler)
    count: int
    steps: tuple[int, ...]  # the steps of its first calls

    @property
    def key(self) -> tuple[str, tuple[str, str, str] | None]:
        return (self.what, self.site.key if self.site is not None else None)


@dataclass(frozen=True)
class ReplicaDigest:
    """One rank's digest of one model at one step."""

    model: int
    step: int
    final: bool  # taken at the end of the training (parameters only)
    buffers: bool  # buffers included (DDP had just broadcast them)
    sync_buffers: bool  # the model's broadcast_buffers
    names: tuple[str, ...]
    values: tuple[int, ...]
    calls: tuple[ReplicaCall, ...]
    cost_s: float | None = None
    every: int | None = None
    t: float | None = None  # when the rank wrote it
    kind: str = "ddp"  # "ddp", "hsdp" (a replicate group's shards), "zero" (ZeRO's parameters)
    peers: tuple[int, ...] | None = None  # the ranks holding the same replica (None: all)

    def by_name(self) -> dict[str, int]:
        return dict(zip(self.names, self.values, strict=False))


def _calls(value: Any) -> tuple[ReplicaCall, ...]:
    if not isinstance(value, list):
        return ()
    out: list[ReplicaCall] = []
    for item in value[:MAX_CALLS]:
        if not isinstance(item, dict):
            continue
        what, count = text(item.get("what")), integer(item.get("count"))
        if what is None or count is None:
            continue
        steps = item.get("steps")
        steps_t = (
            tuple(s for s in steps if isinstance(s, int) and not isinstance(s, bool))
            if isinstance(steps, list)
            else ()
        )
        site = call_site(item.get("site")) if isinstance(item.get("site"), dict) else None
        out.append(ReplicaCall(what, site, item.get("ddp") is True, count, steps_t))
    return tuple(out)


def _peers(value: Any) -> tuple[int, ...] | None:
    """A replica's ranks: distinct, in order, at least two (else the digest compares with
    every rank's, as a DDP model over the whole world)."""
    peers = _ints(value)
    if peers is None or len(peers) > MAX_PEERS or len(peers) < 2:
        return None
    ordered = tuple(sorted(set(peers)))
    return ordered if len(ordered) == len(peers) and ordered[0] >= 0 else None


def _ints(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list) or len(value) > MAX_TENSORS:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return tuple(value)


class ReplicaTrack:
    """One rank's digests (mutable, owned by its RankTracker)."""

    def __init__(self) -> None:
        self.names: dict[int, tuple[str, ...]] = {}  # model -> names of its latest digest
        self.digests: dict[int, dict[int, ReplicaDigest]] = {}  # model -> step -> digest
        self.finals: dict[int, ReplicaDigest] = {}
        self.stride: dict[int, int] = {}
        self._view: tuple[ReplicaDigest, ...] | None = None

    def apply(self, event: dict[str, Any]) -> None:
        model, step = integer(event.get("model")), integer(event.get("step"))
        if model is None or step is None or not 0 <= model < MAX_MODELS or step < 0:
            return
        names_value = event.get("names")
        if (
            isinstance(names_value, list)
            and len(names_value) <= MAX_TENSORS
            and all(isinstance(n, str) for n in names_value)
        ):
            self.names[model] = tuple(names_value)
        names = self.names.get(model)
        values = _ints(event.get("digests"))
        if names is None or values is None or len(values) != len(names):
            return
        cost = event.get("cost_s")
        kind = text(event.get("replica"))
        digest = ReplicaDigest(
            model=model,
            step=step,
            final=event.get("final") is True,
            buffers=event.get("buffers") is True,
            sync_buffers=event.get("sync_buffers") is not False,
            names=names,
            values=values,
            calls=_calls(event.get("calls")),
            cost_s=float(cost) if isinstance(cost, int | float) and cost >= 0 else None,
            every=integer(event.get("every")),
            t=num(event.get("t")),
            kind=kind if kind in KINDS else "ddp",
            peers=_peers(event.get("peers")),
        )
        self._view = None
        if digest.final:
            self.finals[model] = digest
            return
        kept = self.digests.setdefault(model, {})
        kept[step] = digest
        if len(kept) > MAX_KEPT:
            self._thin(model, kept)

    def _thin(self, model: int, kept: dict[int, ReplicaDigest]) -> None:
        stride = self.stride.get(model, 1) * 2
        self.stride[model] = stride
        recent = sorted(kept)[-KEEP_RECENT:]
        for step in list(kept):
            if step % stride and step not in recent and step != min(kept):
                del kept[step]

    def view(self) -> tuple[ReplicaDigest, ...]:
        """Every digest kept, by model and step (the final ones last), made once per change."""
        if self._view is None:
            out = [d for m in sorted(self.digests) for _, d in sorted(self.digests[m].items())]
            out.extend(self.finals[m] for m in sorted(self.finals))
            self._view = tuple(out)
        return self._view
