"""Bookkeeping of collectives: sequence numbers, the ones in flight, and their start/end events.

Torch-free on purpose: the hooks (c10d_hooks, ddp_hooks) describe a call in plain values and this
module numbers it, writes `collective_start`, and writes `collective_end` when the call returns, its
future completes, or a probe polled by the heartbeat thread says it is done.

Sequence numbers count per process and per group, starting at 1, and only the outermost call (an
all_gather_object is one collective, not the all_gathers inside it), so two ranks that made the
same calls hold the same numbers: the monitor compares them to find who is behind. Point-to-point
ops count separately, per group and peer, because ranks that do not take part in a send would
otherwise fall "behind" those that do.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ddpdoctor.events import COLLECTIVE_END, COLLECTIVE_START, DEFAULT_GROUP

Probe = Callable[[], bool]


@dataclass(frozen=True)
class GroupInfo:
    """A process group as events name it (the same name on every rank that is a member)."""

    name: str = DEFAULT_GROUP
    size: int | None = None
    ranks: tuple[int, ...] | None = None  # global ranks; None for the world group (all of them)


@dataclass(frozen=True)
class TensorSummary:
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    numel: int | None = None
    on_gpu: bool = False


class OpenCollective:
    """One collective between its start and end events (mutable: it ends once, from any thread)."""

    __slots__ = (
        "done",
        "group",
        "id",
        "on_end",
        "op",
        "p2p",
        "peer",
        "seq",
        "start_mono",
        "start_t",
    )

    def __init__(
        self,
        op: str,
        seq: int,
        group: GroupInfo,
        start_t: float,
        start_mono: float,
        *,
        p2p: bool,
        peer: int | None,
        ident: int,
    ):
        self.op = op
        self.seq = seq
        self.group = group
        self.start_t = start_t
        self.start_mono = start_mono
        self.p2p = p2p
        self.peer = peer
        self.id = ident
        self.done = False
        # Called with the monotonic end time (a DDP bucket tells its step when it finished).
        self.on_end: Callable[[float], None] | None = None


class CollectiveTracker:
    """Numbers collectives, writes their events, and remembers the ones still in flight."""

    def __init__(
        self,
        emit: Callable[..., None],
        mono_clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self._emit = emit
        self._mono = mono_clock
        self._wall = wall_clock
        self._lock = threading.RLock()
        self._seqs: dict[Any, int] = {}
        self._open: dict[int, OpenCollective] = {}
        self._watched: list[tuple[OpenCollective, Probe, str]] = []
        self._ids = itertools.count(1)
        self.started = 0
        self.done = 0

    def start(
        self,
        op: str,
        group: GroupInfo,
        tensors: TensorSummary,
        *,
        is_async: bool,
        bucket: int | None = None,
        p2p: bool = False,
        peer: int | None = None,
    ) -> OpenCollective:
        key: Any = (group.name, "p2p", peer) if p2p else group.name
        now, wall_t = self._mono(), self._wall()
        with self._lock:
            seq = self._seqs.get(key, 0) + 1
            self._seqs[key] = seq
            rec = OpenCollective(
                op, seq, group, wall_t, now, p2p=p2p, peer=peer, ident=next(self._ids)
            )
            self._open[rec.id] = rec
            self.started += 1
        fields: dict[str, Any] = {
            "op": op,
            "seq": seq,
            "group": group.name,
            "group_size": group.size,
            "group_ranks": list(group.ranks) if group.ranks is not None else None,
            "shapes": [list(s) for s in tensors.shapes],
            "dtypes": list(tensors.dtypes),
            "numel": tensors.numel,
            "async": is_async,
        }
        if bucket is not None:
            fields["bucket"] = bucket
        if p2p:
            fields["p2p"] = True
            fields["peer"] = peer
        self._emit(COLLECTIVE_START, **fields)
        return rec

    def end(
        self, rec: OpenCollective, *, ok: bool = True, error: str | None = None, via: str = "return"
    ) -> float | None:
        """Write the end event once; the duration in seconds, or None when it had ended already."""
        now = self._mono()
        with self._lock:
            if rec.done:
                return None
            rec.done = True
            self._open.pop(rec.id, None)
            self.done += 1
        duration = max(0.0, now - rec.start_mono)
        if rec.on_end is not None:
            try:
                rec.on_end(now)
            except Exception:  # noqa: BLE001
                pass
        fields: dict[str, Any] = {
            "op": rec.op,
            "seq": rec.seq,
            "group": rec.group.name,
            "duration_s": round(duration, 6),
            "ok": ok,
            "error": error,
            "via": via,
        }
        if rec.p2p:
            fields["p2p"] = True
            fields["peer"] = rec.peer
        self._emit(COLLECTIVE_END, **fields)
        return duration

    def watch(self, rec: OpenCollective, probe: Probe, via: str) -> None:
        """End `rec` when `probe()` turns true; the heartbeat thread polls it (see poll)."""
        with self._lock:
            self._watched.append((rec, probe, via))

    @property
    def polling(self) -> bool:
        """True while some collective waits for a polled probe (the heartbeat then polls often)."""
        return bool(self._watched)

    def poll(self) -> int:
        """Check every watched probe once; end those that are done. Returns how many ended."""
        with self._lock:
            watched = list(self._watched)
        finished: list[tuple[OpenCollective, bool, str | None, str]] = []
        for rec, probe, via in watched:
            if rec.done:
                finished.append((rec, True, None, via))
                continue
            try:
                if not probe():
                    continue
                finished.append((rec, True, None, via))
            except Exception as exc:  # noqa: BLE001 - a failed op reports through its probe
                finished.append((rec, False, f"{type(exc).__name__}: {exc}", via))
        if not finished:
            return 0
        ended = {id(item[0]) for item in finished}
        with self._lock:
            self._watched = [w for w in self._watched if id(w[0]) not in ended]
        count = 0
        for rec, ok, error, via in finished:
            if self.end(rec, ok=ok, error=error, via=via) is not None:
                count += 1
        return count

    def open_now(self) -> list[OpenCollective]:
        with self._lock:
            return sorted(self._open.values(), key=lambda r: r.start_mono)

    def oldest_open(self) -> dict[str, Any] | None:
        """The collective in progress for the longest time, as the heartbeat reports it."""
        with self._lock:
            if not self._open:
                return None
            rec = min(self._open.values(), key=lambda r: r.start_mono)
        return {
            "op": rec.op,
            "seq": rec.seq,
            "group": rec.group.name,
            "since_t": rec.start_t,
            "since_mono": rec.start_mono,
            "p2p": rec.p2p,
            "peer": rec.peer,
        }

    def last_seqs(self) -> dict[str, int]:
        """The last collective sequence number started per group (point-to-point excluded)."""
        with self._lock:
            return {k: v for k, v in self._seqs.items() if isinstance(k, str)}


def summarize(tensors: Sequence[Any], *, limit: int = 8) -> TensorSummary:
    """Shapes and dtypes of the first `limit` tensors, numel of all (cheap: no data is touched)."""
    shapes: list[tuple[int, ...]] = []
    dtypes: list[str] = []
    numel = 0
    on_gpu = False
    for i, t in enumerate(tensors):
        try:
            shape = tuple(int(d) for d in t.shape)
            n = 1
            for d in shape:
                n *= d
            numel += n
            if i < limit:
                shapes.append(shape)
                dtypes.append(str(t.dtype).removeprefix("torch."))
            on_gpu = on_gpu or bool(getattr(t, "is_cuda", False))
        except Exception:  # noqa: BLE001 - an odd object is described as nothing
            continue
    return TensorSummary(tuple(shapes), tuple(dtypes), numel if tensors else None, on_gpu)
