"""The fix for a call only some ranks made, in the spelling of the framework the user called.

A mismatch's generic fix ("no collective under `if rank == 0`") is right but says nothing a
Lightning or accelerate user can type: their collective is a helper (`gather_for_metrics`,
`wait_for_everyone`, `self.log(..., sync_dist=True)`, `strategy.barrier()`) and their rank guard
is `accelerator.is_main_process` or `self.global_rank == 0`. The call's site names the framework
function the user called (`via`, ddpdoctor/runtime/call_sites.py); this module turns it into that
framework's own fix.
"""

from __future__ import annotations

from ddpdoctor.monitor.model.snapshot import CallSite

_FIXES: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("gather_for_metrics", "Accelerator.gather", "Accelerator.reduce", "Accelerator.pad"),
        "accelerate: call accelerator.gather_for_metrics(...) (gather, reduce, pad_across_"
        "processes) on every process, outside `if accelerator.is_main_process:`, and use its "
        "result on the main process only",
    ),
    (
        ("wait_for_everyone",),
        "accelerate: call accelerator.wait_for_everyone() on every process, after the "
        "`if accelerator.is_main_process:` branch (save inside it, wait outside it)",
    ),
    (
        ("LightningModule.log", "_sync_ddp", "LightningModule.all_gather"),
        "Lightning: self.log(..., sync_dist=True) and self.all_gather(...) must run on every "
        "rank; to log from rank 0 alone use self.log(..., rank_zero_only=True) without "
        "sync_dist, outside no rank guard",
    ),
    (
        ("Strategy.barrier", "Strategy.broadcast", "Strategy.reduce"),
        "Lightning: call self.trainer.strategy.barrier() (broadcast, reduce) on every rank, "
        "outside `if self.global_rank == 0:` / `if trainer.is_global_zero:`",
    ),
    (
        ("fully_shard[",),
        "FSDP2: run every sharded module on every rank, in the same order: a module that one "
        "rank runs and another skips (a branch on the rank or on rank-local data) all-gathers "
        "alone; run it everywhere and discard its output where it is not needed",
    ),
)


def for_site(site: CallSite | None) -> str:
    """The framework's own fix for an extra call made from `site` ("" when none applies)."""
    if site is None:
        return ""
    through = f"{site.via} {site.issuer}"
    for needles, fix in _FIXES:
        if any(needle in through for needle in needles):
            return fix
    return ""


def with_framework(fix: str, site: CallSite | None) -> str:
    """`fix`, led by the framework's own spelling of it where the site names a framework."""
    own = for_site(site)
    return f"{own[0].upper()}{own[1:]}. {fix}" if own else fix
