"""DataLoader and DistributedSampler: time waiting for data, epochs, and the set_epoch audit.

- Every DataLoader iterator `__next__` is timed: the wait for the next batch, set against the
  step's compute time (steps.py).
- Every epoch of a loader (each `iter(loader)`) writes an `epoch` event with the number of batches
  and samples this rank will see, so ranks that would run different numbers of steps (and hang
  in the last all-reduce) show before it bites; an epoch that starts inside an open
  `with Join(...)` says so (join_hooks.py), since Join evens such ranks by design.
- A shuffling DistributedSampler that runs a full pass again with the epoch number of its last
  full pass (no `set_epoch` call in between) repeats the same order every epoch; the first time
  that happens a `warning` event with code `sampler.set_epoch_missing` says so. The audit counts
  full passes (iterators that handed out all `len(sampler)` indices), not `iter()` calls: scripts
  such as pytorch/examples' DDP tutorial peek one batch (`next(iter(loader))`) before calling
  `set_epoch`, and that peek is not an epoch.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Iterator
from typing import Any

from ddpdoctor.protocol.events import EPOCH, WARNING
from ddpdoctor.runtime import core, join_hooks
from ddpdoctor.runtime.patching import WRAPPED_MARK, patch

EPOCH_ATTR = "_ddpdoctor_epoch"
SET_EPOCH_MISSING = "sampler.set_epoch_missing"


class SamplerAudit:
    __slots__ = ("last_epoch", "passes", "set_since_iter", "warned")

    def __init__(self) -> None:
        self.passes = 0  # full passes: iterators that handed out every index
        self.last_epoch: int | None = None  # the epoch number of the last full pass
        self.set_since_iter = False
        self.warned = False


class LoaderEntry:
    __slots__ = ("ident", "iterations")

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.iterations = 0


_audits: weakref.WeakKeyDictionary[Any, SamplerAudit] = weakref.WeakKeyDictionary()
_loaders: weakref.WeakKeyDictionary[Any, LoaderEntry] = weakref.WeakKeyDictionary()
_loader_ids = itertools.count(1)


def audit_of(sampler: Any) -> SamplerAudit | None:
    try:
        audit = _audits.get(sampler)
        if audit is None:
            audit = _audits[sampler] = SamplerAudit()
        return audit
    except TypeError:  # not weak-referenceable or not hashable
        return None


def on_sampler_iter(sampler: Any, indices: Iterator[Any]) -> Iterator[Any]:
    """A DistributedSampler hands out an epoch's indices: audit the pass once it is complete.

    The epoch number is read now, as the shuffled order is fixed when the iterator is made.
    """
    audit = audit_of(sampler)
    if audit is None:
        return indices
    audit.set_since_iter = False
    epoch = getattr(sampler, "epoch", None)
    total = _length(sampler)
    if total is None or total < 1:
        return _audited(sampler, audit, indices, epoch, total)
    # The first total-1 indices pass through C (islice, chain: no Python per index, which cost
    # ~5 µs a batch of 16); Python runs once, at the last index of the pass.
    return itertools.chain(
        itertools.islice(indices, total - 1), _last_of_pass(sampler, audit, indices, epoch)
    )


def _last_of_pass(
    sampler: Any, audit: SamplerAudit, indices: Iterator[Any], epoch: Any
) -> Iterator[Any]:
    for given, index in enumerate(indices):
        if not given:  # counted before the hand-out: the loop may never ask again
            _end_pass(sampler, audit, epoch)
        yield index


def _audited(
    sampler: Any, audit: SamplerAudit, indices: Iterator[Any], epoch: Any, total: int | None
) -> Iterator[Any]:
    for given, index in enumerate(indices, 1):
        if given == total:  # counted before the hand-out: the loop may never ask again
            _end_pass(sampler, audit, epoch)
        yield index
    if total is None:  # no length to compare with: exhaustion is the end of the pass
        _end_pass(sampler, audit, epoch)


def _end_pass(sampler: Any, audit: SamplerAudit, epoch: Any) -> None:
    # Runs inside the training loop's next(): a diagnostics failure must not stop the loop.
    try:
        on_full_pass(sampler, audit, epoch)
    except Exception:  # noqa: BLE001
        pass


def on_full_pass(sampler: Any, audit: SamplerAudit, epoch: Any) -> None:
    """A full pass ended: warn once if its order repeats the last full pass's."""
    runtime = core.active()
    repeated = audit.passes > 0 and epoch == audit.last_epoch
    audit.passes += 1
    audit.last_epoch = epoch
    if runtime is None or audit.warned or not repeated or not getattr(sampler, "shuffle", False):
        return
    audit.warned = True
    runtime.emit(
        WARNING,
        code=SET_EPOCH_MISSING,
        message=(
            f"DistributedSampler ran epoch {audit.passes} with the same epoch number ({epoch}) "
            "as the epoch before: set_epoch() was not called, so every epoch repeats the same "
            "shuffled order; call sampler.set_epoch(epoch) at the start of each epoch"
        ),
        details={"epoch": epoch, "iterations": audit.passes},
    )


def epoch_fields(loader: Any, distributed_sampler_type: type) -> dict[str, Any]:
    """The `epoch` event of one loader starting an epoch (read before the sampler is iterated)."""
    entry = _loaders.get(loader)
    if entry is None:
        entry = _loaders[loader] = LoaderEntry(next(_loader_ids))
    sampler = getattr(loader, "sampler", None)
    distributed = isinstance(sampler, distributed_sampler_type)
    epoch = getattr(sampler, "epoch", None) if distributed else None
    if not isinstance(epoch, int):
        epoch = entry.iterations
    entry.iterations += 1
    audit = _audits.get(sampler) if distributed else None
    return {
        "epoch": epoch,
        "batches": _length(loader),
        "samples": _length(sampler),
        "shuffle": _shuffles(sampler),
        "set_epoch_called": (audit.set_since_iter if audit else False) if distributed else None,
        "loader": entry.ident,
        "distributed": distributed,
        "batch_size": getattr(loader, "batch_size", None),
        "drop_last": getattr(loader, "drop_last", None),
        "num_workers": getattr(loader, "num_workers", None),
        "join": join_hooks.is_open(),
    }


def _length(obj: Any) -> int | None:
    try:
        return len(obj)
    except Exception:  # noqa: BLE001 - IterableDataset and friends have no length
        return None


def _shuffles(sampler: Any) -> bool | None:
    shuffle = getattr(sampler, "shuffle", None)
    if isinstance(shuffle, bool):
        return shuffle
    name = type(sampler).__name__
    if name == "RandomSampler":
        return True
    if name == "SequentialSampler":
        return False
    return None


def install(runtime: core.Runtime) -> None:
    from torch.utils.data import DataLoader, DistributedSampler
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    original_next = _BaseDataLoaderIter.__next__
    original_iter = DataLoader.__iter__
    original_sampler_iter = DistributedSampler.__iter__
    original_set_epoch = DistributedSampler.set_epoch
    if hasattr(original_next, WRAPPED_MARK):
        return

    @functools.wraps(original_next)
    def __next__(self: Any) -> Any:
        rt = core._active
        if rt is None:
            return original_next(self)
        clock = rt.mono_clock
        t0 = clock()
        try:
            batch = original_next(self)
        except StopIteration:
            rt.steps.on_fetch(t0, clock(), True, None)
            raise
        rt.steps.on_fetch(t0, clock(), False, self.__dict__.get(EPOCH_ATTR))
        return batch

    @functools.wraps(original_iter)
    def __iter__(self: Any) -> Any:
        rt = core.active()
        fields = None
        if rt is not None:
            try:
                fields = epoch_fields(self, DistributedSampler)
                rt.emit(EPOCH, **fields)
            except Exception:  # noqa: BLE001
                fields = None
        iterator = original_iter(self)
        if fields is not None:
            try:
                setattr(iterator, EPOCH_ATTR, fields["epoch"])
            except Exception:  # noqa: BLE001
                pass
        return iterator

    @functools.wraps(original_sampler_iter)
    def sampler_iter(self: Any) -> Any:
        indices = original_sampler_iter(self)
        if core.active() is None:
            return indices
        try:
            return on_sampler_iter(self, indices)
        except Exception:  # noqa: BLE001
            return indices

    @functools.wraps(original_set_epoch)
    def set_epoch(self: Any, epoch: int) -> None:
        original_set_epoch(self, epoch)
        if core.active() is not None:
            audit = audit_of(self)
            if audit is not None:
                audit.set_since_iter = True

    for cls, name, new, old in (
        (_BaseDataLoaderIter, "__next__", __next__, original_next),
        (DataLoader, "__iter__", __iter__, original_iter),
        (DistributedSampler, "__iter__", sampler_iter, original_sampler_iter),
        (DistributedSampler, "set_epoch", set_epoch, original_set_epoch),
    ):
        patch(runtime, cls, name, new, old)
