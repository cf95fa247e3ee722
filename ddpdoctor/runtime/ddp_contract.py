"""DistributedDataParallel's side of the SPMD contract (fingerprint.py), and its gradient syncs.

DDP checks at construction that every rank's parameters have the same shapes; what it does not
check is which of them train (`requires_grad`) and how it was asked to reduce them
(`find_unused_parameters`, `static_graph`, the bucket size, gradients as bucket views): a rank
that differs in one of those builds other buckets, or waits for gradients the others never
reduce. The DDP constructor is wrapped to remember the user's line that called it (once per
model), and the model's first forward with grad compares the contract across ranks, before its
backward reduces anything.

Gradient syncs: every forward with grad outside `no_sync()` makes its backward all-reduce the
gradients (every bucket flushes once). Where the buckets are not events of their own (the
default: DDP's C++ all-reduce, read from the flight recorder on demand), each one is recorded as a collective of its own, op
`ddp_gradient_sync` in the group `<DDP group>:ddp_grads` (numbered per rank, ended at once: it
only counts), with the line that decides it: the latest `no_sync()` call of the model, else the
forward's own line. A rank that syncs more often than the others (its accumulation count
differs) then stands out by its number: the judge's gradient-sync rule compares them.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

from ddpdoctor.runtime import call_sites, core, fingerprint
from ddpdoctor.runtime.c10d_hooks import GROUPS
from ddpdoctor.runtime.collectives import CountedCalls, GroupInfo, TensorSummary
from ddpdoctor.runtime.ddp_hooks import MODE_RECORDER
from ddpdoctor.runtime.patching import patch
from ddpdoctor.runtime.records import CollectiveDesc

SITE_ATTR = "_ddpdoctor_ddp_site"  # the user's line that made the DDP model
DONE_ATTR = "_ddpdoctor_contract_done"
NO_SYNC_ATTR = "_ddpdoctor_no_sync_site"  # the site text of the model's latest no_sync() call
SYNCS_ATTR = "_ddpdoctor_sync_count"  # the count of its gradient syncs (CountedCalls), made once
SYNC_OP = "ddp_gradient_sync"
SYNC_GROUP_SUFFIX = ":ddp_grads"


def settings_text(ddp: Any) -> str:
    """What of DDP's settings changes the collectives: unused-parameter detection, the static
    graph, and the bucket layout. A bucket cap that yields the same buckets, or gradients as bucket
    views (a memory saving), send the very same all-reduces: compared by their effect, never by
    their value, so a per-rank setting that changes nothing never stops a job."""
    return (
        f"find_unused_parameters={getattr(ddp, 'find_unused_parameters', '?')} "
        f"static_graph={getattr(ddp, 'static_graph', '?')} buckets={bucket_layout(ddp)}"
    )


def bucket_limits(ddp: Any) -> list[int]:
    """The byte limits DDP assigns its buckets by once it rebuilds them in the gradients' order:
    the per-bucket caps given, else a first bucket (1 MiB by default) then the cap."""
    config = getattr(ddp, "_bucket_config", None)
    custom = list(getattr(config, "per_bucket_bytes_caps", None) or ())
    if custom:
        return [int(n) for n in custom]
    cap = int(getattr(ddp, "bucket_bytes_cap", 0) or 0)
    first = int(getattr(config, "first_bucket_bytes_cap", cap) or cap)
    return [first, cap] if 0 < first < cap else [cap]


def bucket_layout(ddp: Any) -> str:
    """`[12 elements: 4160, ...]`: the number of gradient elements in each bucket DDP all-reduces
    (the trained parameters in the order their gradients come, the reverse of their order),
    computed as DDP computes it; `?` where torch no longer offers the computation."""
    try:
        import torch.distributed as dist

        params = [p for p in reversed(list(ddp.module.parameters())) if p.requires_grad]
        if not params:
            return "[]"
        indices, _limits = dist._compute_bucket_assignment_by_size(
            params, bucket_limits(ddp), [False] * len(params)
        )
        sizes = [sum(params[i].numel() for i in bucket) for bucket in indices]
    except Exception:  # noqa: BLE001 - a torch that changed: the layout goes uncompared
        return "?"
    text = "[" + ", ".join(str(n) for n in sizes) + "]"
    if len(text) > fingerprint.MAX_VALUE:
        digest = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:12]
        text = f"[{len(sizes)} buckets, {sum(sizes)} elements, digest {digest}]"
    return text


def contract_of(ddp: Any) -> list[fingerprint.Entry]:
    where = ddp.__dict__.get(SITE_ATTR)
    entries: list[fingerprint.Entry] = [("DDP settings", settings_text(ddp), where)]
    entries.extend(fingerprint.param_entries(ddp.module.named_parameters(), lambda _n: where))
    return entries


def check(ddp: Any, rt: core.Runtime) -> None:
    ddp.__dict__[DONE_ATTR] = True
    where = ddp.__dict__.get(SITE_ATTR)
    title = f"the DDP model made at {fingerprint.place(where)}"
    fingerprint.compare(rt, "ddp", title, contract_of(ddp), members_of(ddp))


def members_of(ddp: Any) -> list[int] | None:
    """The global ranks of the DDP model's process group (None: the whole world)."""
    group = GROUPS.describe(ddp.process_group)
    return sorted(group.ranks) if group is not None and group.ranks is not None else None


def sync_counter(ddp: Any, rt: core.Runtime) -> CountedCalls | None:
    counted = ddp.__dict__.get(SYNCS_ATTR)
    if counted is None:
        group = GROUPS.describe(ddp.process_group)
        if group is None:
            return None
        pseudo = GroupInfo(group.name + SYNC_GROUP_SUFFIX, group.size, group.ranks)
        desc = CollectiveDesc(SYNC_OP, pseudo, TensorSummary(), is_async=False)
        desc.immediate = False  # a count, not a call that blocks: never a write on the hot path
        counted = ddp.__dict__[SYNCS_ATTR] = rt.collectives.counter(desc)
    return counted


def counts_syncs(rt: core.Runtime) -> bool:
    """Only where DDP's buckets are not events already (the flight recorder's mode, the default):
    `--ddp-buckets` records every bucket's all-reduce itself, and "off" records none."""
    mode = (rt.bucket_recording or {}).get("mode")
    return mode == MODE_RECORDER


def on_synced_forward(ddp: Any, rt: core.Runtime, counted: CountedCalls | None = None) -> None:
    """A forward whose backward will all-reduce the gradients: counted. Its deciding line (the
    model's latest `no_sync()` call, else the forward's own line) is looked up once per write of
    the count (every few tens of milliseconds), not per forward: the line of a loop's forward
    does not change from one step to the next, and a walk of the stack per step cost more than
    the rest of the runtime's per-step work together. The forward wrapper calls this only for
    a model's first count and after each write; between, it adds one itself."""
    if counted is None:
        counted = sync_counter(ddp, rt)
        if counted is None:
            return
    if counted.site_due:
        counted.site_due = False
        counted.site = ddp.__dict__.get(NO_SYNC_ATTR) or call_sites.caller_site(2)
    counted.count += 1


def install(runtime: core.Runtime) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    original_init = DDP.__init__
    original_no_sync = DDP.no_sync
    if vars(DDP).get("__init__") is None or hasattr(original_init, SITE_ATTR):
        return

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        where = fingerprint.caller(1) if core._active is not None else None
        original_init(self, *args, **kwargs)
        if where is not None:
            self.__dict__[SITE_ATTR] = where

    @functools.wraps(original_no_sync)
    def no_sync(self: Any) -> Any:
        if core._active is not None:
            self.__dict__[NO_SYNC_ATTR] = call_sites.caller_site(1)
        return original_no_sync(self)

    setattr(__init__, SITE_ATTR, True)
    patch(runtime, DDP, "__init__", __init__, original_init)
    patch(runtime, DDP, "no_sync", no_sync, original_no_sync)
