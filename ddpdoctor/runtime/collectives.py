"""Bookkeeping of collectives: sequence numbers, the ones in flight, and their start/end events.

Torch-free on purpose: the hooks (c10d_hooks, ddp_hooks) describe a call in plain values and this
module numbers it, records `collective_start`, and records `collective_end` when the call returns,
its future completes, or a probe polled by the heartbeat thread says it is done. Both are
hot-path records (records.py): the start of a DDP gradient bucket is queued like the ends, the
start of every other call is on disk before the call is entered.

Sequence numbers count per process and per group, starting at 1, and only the outermost call (an
all_gather_object is one collective, not the all_gathers inside it), so two ranks that made the
same calls hold the same numbers: the monitor compares them to find who is behind. Point-to-point
ops count separately, per group and peer, because ranks that do not take part in a send would
otherwise fall "behind" those that do.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ddpdoctor.protocol.events import DEFAULT_GROUP
from ddpdoctor.runtime import records
from ddpdoctor.runtime.records import CollectiveDesc, Record

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

    __slots__ = ("desc", "done", "on_end", "seq", "start_mono", "start_t", "step")

    def __init__(self, desc: CollectiveDesc, seq: int, start_t: float, start_mono: float) -> None:
        self.desc = desc
        self.seq = seq
        self.start_t = start_t
        self.start_mono = start_mono
        self.done = False
        # The training step a DDP bucket belongs to (steps.OpenStep): told when the bucket ends.
        self.step: Any = None
        # Called with the monotonic end time, for anything else that wants to know.
        self.on_end: Callable[[float], None] | None = None

    @property
    def op(self) -> str:
        return self.desc.op

    @property
    def group(self) -> GroupInfo:
        return self.desc.group

    @property
    def p2p(self) -> bool:
        return self.desc.p2p

    @property
    def peer(self) -> int | None:
        return self.desc.peer


# Distinct calls whose descriptions are kept (a loop calls the same few again and again).
MAX_DESCRIPTIONS = 512


class CountedCalls:
    """Calls that only count, never block (DDP's gradient syncs, one per synced forward): the
    training thread adds one (`count += 1`, nothing else); the heartbeat thread writes the latest
    number as one call, start and end, when it flushes (CollectiveTracker.poll). The monitor keeps
    the highest number a rank reached per group, so a batch of syncs reads as the syncs one by one
    would, with the site of the latest. `site_due` asks the next call to say where it comes from
    (one frame walk a flush, not one a call); `site` is that place, as call_sites encodes it."""

    __slots__ = ("count", "desc", "site", "site_due", "written")

    def __init__(self, desc: CollectiveDesc) -> None:
        self.desc = desc
        self.count = 0
        self.written = 0
        self.site: str | None = None
        self.site_due = True


class CollectiveTracker:
    """Numbers collectives, records their events, and remembers the ones still in flight.

    `record(record, immediate)` takes the hot-path records of records.py: `immediate` asks for
    the line to be on disk before the call returns (the writer drains its queue first)."""

    def __init__(
        self,
        record: Callable[[Record, bool], None],
        mono_clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self._record = record
        self._mono = mono_clock
        self._wall = wall_clock
        self._lock = threading.RLock()
        self._seqs: dict[Any, int] = {}
        self._open: dict[OpenCollective, None] = {}  # insertion ordered: the oldest first
        self._watched: list[tuple[OpenCollective, Probe, str]] = []
        self._descriptions: dict[Any, CollectiveDesc] = {}
        self._counted: list[CountedCalls] = []
        self.started = 0
        self.done = 0
        # The training step a call is made in (the runtime's StepTracker.current): a call is
        # reported at the step it was made, not at the rank's step when a rule looked at it.
        self.step_of: Callable[[], int] | None = None

    def describe(
        self,
        op: str,
        group: GroupInfo,
        tensors: TensorSummary,
        *,
        is_async: bool,
        bucket: int | None = None,
        p2p: bool = False,
        peer: int | None = None,
    ) -> CollectiveDesc:
        """The description of a call, encoded once per distinct call."""
        key = (op, group, tensors, is_async, bucket, p2p, peer)
        desc = self._descriptions.get(key)
        if desc is None:
            desc = CollectiveDesc(
                op, group, tensors, is_async=is_async, bucket=bucket, p2p=p2p, peer=peer
            )
            if len(self._descriptions) >= MAX_DESCRIPTIONS:
                self._descriptions.clear()
            self._descriptions[key] = desc
        return desc

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
        desc = self.describe(
            op, group, tensors, is_async=is_async, bucket=bucket, p2p=p2p, peer=peer
        )
        return self.begin(desc)

    def begin(self, desc: CollectiveDesc, site: str | None = None) -> OpenCollective:
        """Number a call of `desc` and record its start (the hot path of every collective);
        `site` is where it was called from, as call_sites.site_of encodes it."""
        now, wall_t = self._mono(), self._wall()
        key = desc.seq_key
        with self._lock:
            seq = self._seqs.get(key, 0) + 1
            self._seqs[key] = seq
            rec = OpenCollective(desc, seq, wall_t, now)
            self._open[rec] = None
            self.started += 1
        step = self.step_of() if self.step_of is not None else 0
        self._record((records.collective_start, wall_t, now, desc, seq, site, step), desc.immediate)
        return rec

    def end(
        self, rec: OpenCollective, *, ok: bool = True, error: str | None = None, via: str = "return"
    ) -> float | None:
        """Record the end once; the duration in seconds, or None when it had ended already."""
        now = self._mono()
        with self._lock:
            if rec.done:
                return None
            rec.done = True
            self._open.pop(rec, None)
            self.done += 1
        step = rec.step
        if step is not None and not step.closed:
            done = step.bucket_done
            step.bucket_done = now if done is None or now > done else done
        if rec.on_end is not None:
            try:
                rec.on_end(now)
            except Exception:  # noqa: BLE001
                pass
        if not ok and error is None:
            error = "failed"
        duration = now - rec.start_mono
        self._record(
            (records.collective_end, self._wall(), now, rec.desc, rec.seq, duration, error, via),
            False,
        )
        return duration if duration > 0.0 else 0.0

    def watch(self, rec: OpenCollective, probe: Probe, via: str) -> None:
        """End `rec` when `probe()` turns true; the heartbeat thread polls it (see poll)."""
        with self._lock:
            self._watched.append((rec, probe, via))

    @property
    def polling(self) -> bool:
        """True while some collective waits for a polled probe (the heartbeat then polls often)."""
        return bool(self._watched)

    def counter(self, desc: CollectiveDesc) -> CountedCalls:
        """A new count of calls of `desc`, written by poll() (see CountedCalls)."""
        counted = CountedCalls(desc)
        with self._lock:
            self._counted.append(counted)
        return counted

    def write_counts(self) -> None:
        """Write the counted calls' news now: before a line that is written at once (a fault,
        an error, a collective's start), so that the file keeps the order the calls came in
        (a sync counted before a hang is not read as the rank's last act after it)."""
        if self._counted:
            self._write_counts()

    def _write_counts(self) -> None:
        for counted in self._counted:
            seq = counted.count  # read once: the training thread may add meanwhile
            if seq <= counted.written:
                continue
            counted.written = seq
            desc = counted.desc
            with self._lock:
                if seq <= self._seqs.get(desc.seq_key, 0):
                    continue
                self._seqs[desc.seq_key] = seq
            now, wall_t = self._mono(), self._wall()
            # (no step: counted calls are written up to 0.5 s after they were made, and the
            # step at writing is not the step they were made in)
            self._record((records.collective_start, wall_t, now, desc, seq, counted.site, 0), False)
            self._record(
                (records.collective_end, wall_t, now, desc, seq, 0.0, None, "count"), False
            )
            counted.site_due = True

    def poll(self, counts: bool = True) -> int:
        """Write the counted calls' news (unless `counts` is False: the heartbeat writes them at
        its own, slower pace), check every watched probe once and end those that are done.
        Returns how many ended."""
        if counts and self._counted:
            self._write_counts()
        if not self._watched:
            return 0
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
            return sorted(self._open, key=lambda r: r.start_mono)

    def oldest_open(self) -> dict[str, Any] | None:
        """The collective in progress for the longest time, as the heartbeat reports it."""
        with self._lock:
            if not self._open:
                return None
            rec = min(self._open, key=lambda r: r.start_mono)
        desc = rec.desc
        opened = {
            "op": desc.op,
            "seq": rec.seq,
            "group": desc.group.name,
            "since_t": rec.start_t,
            "since_mono": rec.start_mono,
            "p2p": desc.p2p,
            "peer": desc.peer,
        }
        if desc.parts:  # a batch of sends and receives: every peer it waits on
            opened["peers"] = sorted({part[1] for part in desc.parts})
        return opened

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
            shape = tuple(map(int, t.shape))
            numel += math.prod(shape)
            if i < limit:
                shapes.append(shape)
                dtypes.append(dtype_name(t.dtype))
            on_gpu = on_gpu or bool(getattr(t, "is_cuda", False))
        except Exception:  # noqa: BLE001 - an odd object is described as nothing
            continue
    return TensorSummary(tuple(shapes), tuple(dtypes), numel if tensors else None, on_gpu)


_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """ "float32" for torch.float32 (remembered: dtypes are few and str() is not free)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = str(dtype).removeprefix("torch.")
        try:
            _DTYPE_NAMES[dtype] = name
        except TypeError:  # an unhashable stand-in
            pass
    return name
