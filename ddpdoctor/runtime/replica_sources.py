"""Replicas other than a DDP model's: HSDP's shards and ZeRO's replicated parameters.

Both are digested on the schedule and with the digest of replicas.py; this module only says what
must agree, among which ranks, and when every rank of them is at the same point of a step.

- HSDP (FSDP2 `fully_shard` with a 2-D DeviceMesh (replicate, shard), or FSDP2's replicate-only
  mesh): every rank of one replicate group holds the same shard of each parameter, and the
  gradient all-reduce across that group hands each the same averaged bytes, so their sharded
  parameters stay bit-identical. Digested: the local shard of each sharded parameter (what the
  optimizer updates; never the unsharded copy a forward all-gathers), at the root's training
  forward (fsdp_hooks.py), compared among the ranks of the replicate group (`peers`). FSDP2
  broadcasts nothing at construction: ranks that built their model from different seeds differ
  from step 0, and are found there. A plain FSDP mesh (shard only) replicates nothing.
- ZeRO-1/2 (torch's ZeroRedundancyOptimizer): every rank holds every parameter; each updates the
  partition it owns and broadcasts it at the end of its step. Digested: every parameter of the
  optimizer, before its step (what that step's forward and backward used), compared across the
  optimizer's process group — unless a DDP model digested among the same ranks holds them all
  (the usual DDP + ZeRO-1 job): its digest at the forward covers them, once. A write on some ranks therefore lasts until the next step, when the
  owners' broadcasts overwrite it with a mix of the ranks' parameters: the replicas agree again
  but the model is wrong. The call counts that travel with every digest (replica_calls.py) are
  what find that (monitor/judge/rules/replicas.py: `replicas.updates_differ`).

- DeepSpeed's engine (ZeRO stage 0, 1 or 2): every rank of its data-parallel group holds the
  whole module; at stages 1 and 2 each updates the partition it owns and all-gathers the
  updated parameters at the end of its step, as torch's ZeRO does (kind "zero": the call counts
  are compared too); at stage 0 the averaged gradients keep them identical (kind "ddp").
  Digested: the module's parameters at the engine's synced training forward, compared across
  the data-parallel group. Stage 3 partitions the parameters themselves: nothing is replicated.

Cost per step: the FSDP root's forward and DeepSpeed's engine forward pay one dict look-up and
a compare (replicas.py does the rest at a due step); a ZeRO optimizer's step pays one pre-hook
call.
"""

from __future__ import annotations

import functools
from typing import Any

from ddpdoctor.runtime import core, replica_calls, replicas
from ddpdoctor.runtime.import_hooks import when_imported
from ddpdoctor.runtime.patching import WRAPPED_MARK, patch

ZERO_MODULE = "torch.distributed.optim.zero_redundancy_optimizer"


def hsdp_of(state: Any) -> tuple[str, list[int] | None, replicas.Source] | None:
    """An FSDP root state's replicated shards: the parameters of its units that have a replicate
    dimension and the same replicate group as the first such unit, with that group's ranks."""
    import torch.distributed as dist

    params: list[tuple[str, Any]] = []
    peers: list[int] | None = None
    for st in state._state_ctx.all_states:
        for group in st._fsdp_param_groups:
            info = group.mesh_info
            if getattr(info, "replicate_mesh_dim", None) is None:
                continue
            ranks = sorted(
                int(r) for r in dist.get_process_group_ranks(info.replicate_process_group)
            )
            if peers is None:
                peers = ranks
            if ranks != peers:
                continue
            for fsdp_param in group.fsdp_params:
                name = fsdp_param._param_fqn or fsdp_param._module_info.param_name
                params.append((name, fsdp_param))
    if peers is None or len(peers) < 2 or not params:
        return None
    world = dist.get_world_size()
    names = [name for name, _ in params]
    fsdp_params = [p for _, p in params]

    def source(_owner: Any) -> tuple[list[str], list[Any]]:
        # the sharded parameter as it is now (the optimizer may have replaced the Parameter)
        return names, [p.sharded_param.to_local() for p in fsdp_params]

    return "hsdp", (peers if len(peers) < world else None), source


def on_fsdp_root_forward(rt: core.Runtime, state: Any) -> None:
    """From fsdp_hooks at a synced training forward of a root: digest its replicated shards if
    their due step has come (the first time: find them)."""
    digests = state.__dict__.get(replicas.STATE_ATTR)
    if digests is False or (digests and rt.steps.steps_done < digests.next_step):
        return
    replicas.due_other(state, rt, hsdp_of)


def zero_of(optimizer: Any) -> tuple[str, list[int] | None, replicas.Source] | None:
    """A ZeroRedundancyOptimizer's parameters (every rank holds all of them), by the names of
    the module they belong to when a digested DDP model holds them, else by position."""
    params = list(getattr(optimizer, "_all_params", None) or ())
    if not params:
        params = [p for g in optimizer.param_groups for p in g["params"]]
    if not params:
        return None
    known: dict[int, str] = {}
    digested: set[int] = set()  # ... of those, the ones a DDP digest among the same ranks covers
    covering = []
    peers = replicas.group_ranks(getattr(optimizer, "process_group", None))
    mine = {id(p) for p in params}
    for state in replicas._STATES:  # the DDP models this rank trains: their parameters' names
        model = state.model() if state.kind == "ddp" else None
        if model is not None:
            named = list(model.module.named_parameters())
            known.update((id(p), n) for n, p in named)
            if state.peers == peers and any(id(p) in mine for _, p in named):
                digested.update(id(p) for n, p in named if n not in state.ignored)
                covering.append(state)
    if all(id(p) in digested for p in params):
        # A ZeRO optimizer over a DDP model: the model's digest at its forward already sums the
        # same parameters among the same ranks, with the same calls, at the same step (nothing
        # writes them between that forward and this step but the user's code, which the next
        # forward's digest sees). Digesting them twice would double the cost for nothing; the
        # model's digests say from now on that ZeRO updates them (its partitions heal each
        # step, so the watcher compares the calls too: replicas.updates_differ).
        for state in covering:
            state.kind = "zero"
        return None
    names = [known.get(id(p)) or f"param[{i}] {tuple(p.shape)}" for i, p in enumerate(params)]

    def source(_owner: Any) -> tuple[list[str], list[Any]]:
        return names, params

    return "zero", peers, source


def deepspeed_of(engine: Any) -> tuple[str, list[int] | None, replicas.Source] | None:
    """A DeepSpeed engine's replicated module parameters (ZeRO stage 0, 1 or 2) and its
    data-parallel group's ranks; None at stage 3 or where the stage cannot be read."""
    stage_of = getattr(engine, "zero_optimization_stage", None)
    stage = stage_of() if callable(stage_of) else None
    module = getattr(engine, "module", None)
    if stage not in (0, 1, 2) or module is None:
        return None
    named = [(n, p) for n, p in module.named_parameters()]
    if not named:
        return None
    try:
        module.__dict__[replica_calls.MODULE_MARK] = True  # a reload into it is counted
    except Exception:  # noqa: BLE001 - only the citation of a load into it is lost
        pass
    names = [n for n, _ in named]
    params = [p for _, p in named]
    peers = replicas.group_ranks(getattr(engine, "data_parallel_group", None))

    def source(_owner: Any) -> tuple[list[str], list[Any]]:
        return names, params

    return ("zero" if stage else "ddp"), peers, source


def on_deepspeed_forward(rt: core.Runtime, engine: Any) -> None:
    """From deepspeed_hooks at a synced training forward of the engine: digest its replicated
    parameters if their due step has come (the first time: find them)."""
    digests = engine.__dict__.get(replicas.STATE_ATTR)
    if digests is False or (digests and rt.steps.steps_done < digests.next_step):
        return
    replicas.due_other(engine, rt, deepspeed_of)


def _zero_pre_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    rt = core._active
    if rt is None:
        return
    try:
        digests = optimizer.__dict__.get(replicas.STATE_ATTR)
        if digests is False or (digests and rt.steps.steps_done < digests.next_step):
            return
        replicas.due_other(optimizer, rt, zero_of)
    except Exception:  # noqa: BLE001 - never stand between the optimizer and its step
        pass


def install_zero(runtime: core.Runtime, module: Any) -> None:
    cls = getattr(module, "ZeroRedundancyOptimizer", None)
    init = vars(cls).get("__init__") if cls is not None else None
    if init is None or hasattr(init, WRAPPED_MARK):
        return

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if core._active is not None and not getattr(self, "_overlap_with_ddp", False):
            try:
                self.register_step_pre_hook(_zero_pre_step)
            except Exception:  # noqa: BLE001 - its replicas go undigested
                pass

    patch(runtime, cls, "__init__", __init__, init)


def install(runtime: core.Runtime) -> None:
    """Hook ZeroRedundancyOptimizer once the script imports it (now, if it has); FSDP's roots
    come through fsdp_hooks."""

    def zero_imported(module: Any) -> None:
        if core.active() is runtime and replicas._ON:
            install_zero(runtime, module)

    when_imported(ZERO_MODULE, zero_imported)
