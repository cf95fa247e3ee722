"""Replica digests: what every rank of a DDP model must hold identically, summed on its device.

DDP broadcasts rank 0's parameters and buffers once, at construction; from then on every rank
applies the same averaged gradients with the same optimizer, so the replicas stay bit-identical
unless the code writes them on some ranks only (replica_calls.py). Nothing hangs when they drift:
the job ends with a wrong model. Each rank therefore writes, now and then, a digest of its replica
with its step events, and the watcher compares the digests of one step across ranks. No
collective, no store traffic: the ranks never wait for each other for it.

The digest of a tensor is the sum of its raw bits (its bytes viewed as 8-byte integers, or as
integers of its element size when its size is no multiple of 8, summed into an int64 on its own
device): integer addition is exact and associative, so the
digest does not depend on how the sum is split across threads or blocks, and any changed element
changes it. All tensors' digests are stacked and copied to the host at once (one copy, on a GPU
one synchronization). The comparison is exact (bit for bit): the gradient all-reduce hands every
rank the same averaged bytes, and the same optimizer on the same bytes computes the same bytes,
so nondeterministic kernels in forward and backward (which feed the average) cannot make the
replicas differ; only a write some ranks make does.

When: at the first synced training forward whose step number (steps finished so far, the same on
every rank) reaches the model's next due step, ddpdoctor's DDP forward wrapper (ddp_hooks.py)
calls `due`; between, it compares two integers. Due steps are the multiples of K, a power of two
chosen from the measured digest cost and step time so that the digest costs at most
TARGET_FRACTION of the training time: ranks that measured differently still share every multiple
of the larger K. Buffers are digested only at a forward where DDP has just broadcast them from
rank 0 (a forward pre-hook of the module, which runs after DDP's buffer sync): between syncs each
rank's BatchNorm statistics follow its own batches, by design. Parameters DDP ignores
(`_ddp_params_and_buffers_to_ignore`) are not compared. At the end (destroy_process_group, or a
clean exit with the model still alive) a last digest of the parameters says whether the replicas
agreed at the end. Once torch's Join is entered, no more digests at due steps (stop_step_digests):
under Join the ranks run different numbers of steps, and differ between Join's syncs, by design.

Other replicas (replica_sources.py) use the same schedule and digest: HSDP's shards across the
replicate dimension of its mesh (digested at the FSDP root's training forward, compared among
the ranks of one replicate group), and the parameters of torch's ZeroRedundancyOptimizer
(digested before its step, compared across its process group). Each digest says its kind and,
when they are not every rank, the ranks that must hold the same replica (`peers`).
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from typing import Any

from ddpdoctor.protocol.events import REPLICA_DIGEST
from ddpdoctor.runtime import core, replica_calls

ENV = "DDPDOCTOR_REPLICAS"  # "0": no digests
TARGET_FRACTION = 0.005  # of the step time, at most, spent on digests
MAX_EVERY = 1024  # steps between digests at most (a power of two)
MIN_EVERY = 8  # ... at least, once the step time is known (the first two come at steps 0 and 1)
NEVER = 1 << 62
STATE_ATTR = "_ddpdoctor_replicas"
_STATES: list[ModelState] = []  # every DDP model seen training, in order (its index: its id)
_ON = False  # installed and enabled
# Whether the ranks' step numbers still name the same update on every rank: false once torch's
# Join was entered (stop_step_digests).
_STEPS_ALIGNED = True


def enabled(environ: Any = os.environ) -> bool:
    return str(environ.get(ENV, "")).strip().lower() not in ("0", "false", "no", "off")


# A replica other than a DDP model's (replica_sources.py): its owner -> (names, tensors)
Source = Callable[[Any], tuple[list[str], list[Any]]]


class ModelState:
    """One DDP model's digest schedule (mutable; kept on the model and in _STATES)."""

    __slots__ = (
        "__weakref__",
        "cost_s",
        "costs",
        "every",
        "final_step",
        "ignored",
        "index",
        "kind",
        "last_end",
        "last_step",
        "model",
        "names",
        "next_step",
        "peers",
        "source",
        "step_s",
        "sync_buffers",
    )

    def __init__(
        self,
        owner: Any,
        index: int,
        kind: str = "ddp",
        peers: list[int] | None = None,
        source: Source | None = None,
    ) -> None:
        self.model = weakref.ref(owner)
        self.index = index
        self.kind = kind
        self.peers = peers  # the global ranks holding the same replica (None: every rank)
        self.source = source  # what to digest (None: the DDP model's parameters and buffers)
        self.ignored = frozenset(getattr(owner, "parameters_to_ignore", ()) or ())
        self.sync_buffers = bool(getattr(owner, "broadcast_buffers", True))
        self.next_step = 0
        self.every = 1
        self.cost_s: float | None = None
        self.costs: list[float] = []
        self.step_s: float | None = None
        self.last_step: int | None = None
        self.last_end: float | None = None
        self.names: tuple[str, ...] | None = None  # the names last written
        self.final_step: int | None = None


def _bits(tensor: Any) -> Any:
    """The tensor's bytes as integers whose plain int64 sum is its digest: 8-byte words when
    its size allows (summed natively: a sum that converts int32 to int64 on the way takes a
    path ten times slower on the CPU), else integers of its element size."""
    import torch

    t = tensor.detach()
    if t.dtype is torch.bool:
        t = t.to(torch.uint8)
    if t.is_complex():
        t = torch.view_as_real(t)
    t = t.reshape(-1)
    if not t.is_contiguous():
        t = t.contiguous()
    size = t.element_size()
    if (t.numel() * size) % 8 == 0 and t.numel():
        try:
            return t.view(torch.int64)
        except RuntimeError:  # a view at an offset that 8-byte words cannot start at
            pass
    as_int = _INTS.get(size)
    if as_int is None:
        raise TypeError(f"no integer view for {t.dtype}")
    return t if t.dtype is as_int else t.view(as_int)


_INTS: dict[int, Any] = {}


def digest_tensors(tensors: list[Any]) -> list[int]:
    """The bit-sum of each tensor, reduced on its device, copied to the host at once."""
    import torch

    if not _INTS:
        _INTS.update({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8})
    if not tensors:
        return []
    sums = [_bits(t).sum(dtype=torch.int64) for t in tensors]
    device = sums[0].device
    if all(s.device == device for s in sums):
        return [int(v) for v in torch.stack(sums).tolist()]
    return [int(s.item()) for s in sums]


def _named(state: ModelState, ddp: Any, buffers: bool) -> tuple[list[str], list[Any]]:
    module = ddp.module
    names: list[str] = []
    tensors: list[Any] = []
    ignored = state.ignored
    for name, param in module.named_parameters():
        if name not in ignored:
            names.append(name)
            tensors.append(param)
    if buffers:
        for name, buf in module.named_buffers():
            if name not in ignored:
                names.append(name)
                tensors.append(buf)
    return names, tensors


def take(state: ModelState, rt: core.Runtime, step: int, *, buffers: bool, final: bool) -> None:
    """Digest the model now and write it; choose the next due step from what it cost."""
    ddp = state.model()
    if ddp is None:
        return
    t0 = time.perf_counter()
    if state.source is None:
        names, tensors = _named(state, ddp, buffers)
    else:
        names, tensors = state.source(ddp)
        buffers = False
    values = digest_tensors(tensors)
    fields: dict[str, Any] = {
        "model": state.index,
        "replica": state.kind,
        "step": step,
        "final": final,
        "buffers": buffers,
        "sync_buffers": state.sync_buffers,
        "every": state.every,
        "digests": values,
        "calls": replica_calls.snapshot(),
    }
    if state.peers is not None:
        fields["peers"] = state.peers
    if tuple(names) != state.names:
        state.names = tuple(names)
        fields["names"] = names
    cost = time.perf_counter() - t0
    fields["cost_s"] = round(cost, 7)
    rt.emit(REPLICA_DIGEST, **fields)
    if final:
        state.final_step = step
        return
    _schedule(state, step, cost, time.perf_counter())
    rt.replica_next = min(s.next_step for s in _STATES)


def _schedule(state: ModelState, step: int, cost: float, now: float) -> None:
    # the median of the last three costs: one digest slowed by a busy machine (a preempted
    # thread) must not spread the digests of this rank out of step with the others'
    recent = state.costs
    recent.append(cost)
    del recent[:-3]
    state.cost_s = sorted(recent)[len(recent) // 2]
    if state.last_end is not None and state.last_step is not None and step > state.last_step:
        # the training time per step since the last digest ended (this one's cost excluded)
        per_step = (now - cost - state.last_end) / (step - state.last_step)
        if per_step > 0:
            state.step_s = per_step
    state.last_step, state.last_end = step, now
    if state.step_s is None:
        every = 1
    else:
        # the budget is shared by every replica this rank digests (a DDP model and its ZeRO
        # optimizer: both within TARGET_FRACTION together)
        wanted = state.cost_s * max(1, len(_STATES)) / (TARGET_FRACTION * state.step_s)
        every = MIN_EVERY
        while every < wanted and every < MAX_EVERY:
            every *= 2
    state.every = every
    state.next_step = (step // every + 1) * every


def stop_step_digests() -> None:
    """torch's `with Join(...)` was entered (join_hooks.py): from here a rank out of data
    shadows the others' collectives while they train on alone, and at its exit Join broadcasts
    the last joiner's model, so the replicas differ between those syncs by design and the ranks'
    step numbers no longer name the same update (rank 0's step 8 may be rank 1's step 11). No
    more digests at due steps: one compared across ranks would call a healthy job diverged. The
    digest at the end stays (Join has synced the model by then)."""
    global _STEPS_ALIGNED
    _STEPS_ALIGNED = False
    for state in _STATES:
        state.next_step = NEVER
    runtime = core._active
    if runtime is not None:
        runtime.replica_next = NEVER


def due(ddp: Any, rt: core.Runtime) -> None:
    """From the DDP forward wrapper, before DDP's forward: a synced training forward at or past
    `rt.replica_next`, or the first of a model. Digest this model now if its due step has come."""
    state = ddp.__dict__.get(STATE_ATTR)
    if not _ON:  # digests off (a model seen first is marked all the same)
        setattr(ddp, STATE_ATTR, False)
        return
    if not state:
        group = getattr(ddp, "process_group", None)
        if group_size(group) == 1:
            # a DDP over a one-rank group holds no replica of another rank's: torchft's DDP
            # (its dummy group; the Manager averages across replica groups, which may be at
            # other steps and heal from each other) or a DDP made on a rank's own subgroup
            setattr(ddp, STATE_ATTR, False)
            return
        peers = group_ranks(group)
        state = ModelState(ddp, len(_STATES), "ddp", peers)
        _STATES.append(state)
        setattr(ddp, STATE_ATTR, state)
        try:
            ddp.module.__dict__[replica_calls.MODULE_MARK] = True
        except Exception:  # noqa: BLE001 - only the citation of a load into it is lost
            pass
    if not _STEPS_ALIGNED:
        state.next_step = NEVER
        return
    step = rt.steps.steps_done
    if step < state.next_step:
        rt.replica_next = min(s.next_step for s in _STATES)
        return
    state.next_step = NEVER  # until taken (a forward that raises before the hook runs)
    rt.replica_next = min(s.next_step for s in _STATES)
    sync = False
    try:
        sync = bool(ddp._check_sync_bufs_pre_fwd())
    except Exception:  # noqa: BLE001 - a DDP without it: parameters only
        sync = False
    if not sync:
        take(state, rt, step, buffers=False, final=False)
        return
    handle: Any = None

    def after_buffer_sync(module: Any, args: Any) -> None:
        handle.remove()
        current = core._active
        if current is not None:
            try:
                take(state, current, step, buffers=True, final=False)
            except Exception:  # noqa: BLE001 - never stand between DDP and its forward
                state.next_step = NEVER

    handle = ddp.module.register_forward_pre_hook(after_buffer_sync)


def group_size(group: Any) -> int | None:
    """How many ranks a process group other than the default one has (None: unknown, or the
    default group, whose ranks are every rank the watcher reads)."""
    if group is None:
        return None
    try:
        import torch.distributed as dist

        if dist.is_initialized() and group is dist.distributed_c10d._get_default_group():
            return None
        return int(group.size())
    except Exception:  # noqa: BLE001 - a group that cannot say: compared as before
        return None


def group_ranks(group: Any) -> list[int] | None:
    """The global ranks of a process group, or None when it is every rank (or unknown)."""
    if group is None:
        return None
    try:
        import torch.distributed as dist

        ranks = sorted(int(r) for r in dist.get_process_group_ranks(group))
        return ranks if 0 < len(ranks) < dist.get_world_size() else None
    except Exception:  # noqa: BLE001 - a group torch cannot place: compared as every rank's
        return None


def due_other(owner: Any, rt: core.Runtime, make: Any) -> None:
    """A replica other than a DDP model's (replica_sources.py), at a point every rank of it
    reaches at the same step: the FSDP root's training forward, a ZeRO optimizer's step. The
    first time, `make(owner)` says what it is: (kind, peers, source), or None (nothing
    replicated: the owner is marked and costs one dict look-up from then on)."""
    state = owner.__dict__.get(STATE_ATTR)
    if state is False:
        return
    if state is None:
        made = make(owner) if _ON else None
        if made is None:
            owner.__dict__[STATE_ATTR] = False
            return
        kind, peers, source = made
        state = ModelState(owner, len(_STATES), kind, peers, source)
        _STATES.append(state)
        owner.__dict__[STATE_ATTR] = state
    if not _STEPS_ALIGNED:
        state.next_step = NEVER
        return
    step = rt.steps.steps_done
    if step < state.next_step:
        return
    state.next_step = NEVER  # until taken
    take(state, rt, step, buffers=False, final=False)


def at_end(rt: core.Runtime) -> None:
    """A last digest of each model still alive (parameters only: the last forward updated each
    rank's BatchNorm statistics from its own batch, and no sync follows)."""
    step = rt.steps.steps_done
    for state in list(_STATES):
        if state.final_step == step or state.model() is None:
            continue
        try:
            take(state, rt, step, buffers=False, final=True)
        except Exception:  # noqa: BLE001 - the end of a run is no place to fail
            pass


def install(runtime: core.Runtime) -> None:
    global _ON
    if not enabled():
        runtime.replica_next = NEVER
        return
    replica_calls.install(runtime)
    runtime.replica_next = 0
    runtime.at_end.append(at_end)
    _ON = True
    runtime.on_deactivate(_off)


def _off() -> None:
    global _ON, _STEPS_ALIGNED
    _ON = False
    _STEPS_ALIGNED = True
    _STATES.clear()
