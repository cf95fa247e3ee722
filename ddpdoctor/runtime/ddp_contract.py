"""DistributedDataParallel's side of the SPMD contract (fingerprint.py).

DDP checks at construction that every rank's parameters have the same shapes; what it does not
check is which of them train (`requires_grad`) and how it was asked to reduce them
(`find_unused_parameters`, `static_graph`, the bucket size, gradients as bucket views): a rank
that differs in one of those builds other buckets, or waits for gradients the others never
reduce. The DDP constructor is wrapped to remember the user's line that called it (once per
model), and the model's first forward with grad compares the contract across ranks, before its
backward reduces anything.
"""

from __future__ import annotations

import functools
from typing import Any

from ddpdoctor.runtime import core, fingerprint
from ddpdoctor.runtime.patching import patch

SITE_ATTR = "_ddpdoctor_ddp_site"  # the user's line that made the DDP model
DONE_ATTR = "_ddpdoctor_contract_done"


def settings_text(ddp: Any) -> str:
    cap = getattr(ddp, "bucket_bytes_cap", None)
    cap_mb = f"{cap / 2**20:g}" if isinstance(cap, int | float) else "?"
    return (
        f"find_unused_parameters={getattr(ddp, 'find_unused_parameters', '?')} "
        f"static_graph={getattr(ddp, 'static_graph', '?')} bucket_cap_mb={cap_mb} "
        f"gradient_as_bucket_view={getattr(ddp, 'gradient_as_bucket_view', '?')}"
    )


def contract_of(ddp: Any) -> list[fingerprint.Entry]:
    where = ddp.__dict__.get(SITE_ATTR)
    entries: list[fingerprint.Entry] = [("DDP settings", settings_text(ddp), where)]
    entries.extend(fingerprint.param_entries(ddp.module.named_parameters(), lambda _n: where))
    return entries


def check(ddp: Any, rt: core.Runtime) -> None:
    ddp.__dict__[DONE_ATTR] = True
    where = ddp.__dict__.get(SITE_ATTR)
    title = f"the DDP model made at {fingerprint.place(where)}"
    fingerprint.compare(rt, "ddp", title, contract_of(ddp))


def install(runtime: core.Runtime) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    original_init = DDP.__init__
    original_forward = DDP.forward
    if vars(DDP).get("__init__") is None or hasattr(original_init, SITE_ATTR):
        return
    grad_enabled = torch.is_grad_enabled

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        where = fingerprint.caller(1) if core._active is not None else None
        original_init(self, *args, **kwargs)
        if where is not None:
            self.__dict__[SITE_ATTR] = where

    @functools.wraps(original_forward)
    def forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        rt = core._active
        if rt is not None and not self.__dict__.get(DONE_ATTR) and grad_enabled():
            try:
                check(self, rt)
            except Exception:  # noqa: BLE001 - a check, never a reason to stop the forward
                pass
        return original_forward(self, *inputs, **kwargs)

    setattr(__init__, SITE_ATTR, True)
    patch(runtime, DDP, "__init__", __init__, original_init)
    patch(runtime, DDP, "forward", forward, original_forward)
