"""DistributedDataParallel's forward: the one wrapper that does, per forward, all ddpdoctor does.

Every capability that looks at a DDP forward runs from this one wrapper, in one Python frame:

- the SPMD contract (ddp_contract.check), once per model, at its first forward with grad;
- the gradient-sync count (ddp_contract): `count += 1` on a synced forward with grad, its
  deciding line looked up only when the count is next written (ddp_contract.on_synced_forward);
- the steps (steps.py) and the automatic phases ("train" / "eval");
- the replica digests' due-step check (replicas.py): an integer compare until one is due;
- DDP's C++ timers (ddp_hooks.CommProbe), read after DDP's forward once a second;
- the comm hook's registration at the first training forward (`--ddp-buckets`: ddp_hooks.py);
- DDP's reducer errors named (ddp_errors.py) as they pass.

It was two wrappers stacked (the contract's around the steps'), each looking up the runtime,
grad mode and the model's state again: a Python frame and a dozen lookups a step for nothing.
"""

from __future__ import annotations

import functools
from typing import Any

from ddpdoctor.runtime import core, ddp_contract, ddp_errors, ddp_hooks, replicas
from ddpdoctor.runtime.patching import WRAPPED_MARK, patch

DONE_ATTR = ddp_contract.DONE_ATTR
SYNCS_ATTR = ddp_contract.SYNCS_ATTR
SLOT_ATTR = ddp_hooks.SLOT_ATTR
PROBE_ATTR = ddp_hooks.PROBE_ATTR
DIGESTS_ATTR = replicas.STATE_ATTR


def first_forward(ddp: Any, rt: core.Runtime) -> None:
    """Once per model, at its first forward with grad: the contract check, its GPU."""
    try:
        ddp_contract.check(ddp, rt)
    except Exception:  # noqa: BLE001 - a check, never a reason to stop the forward
        ddp.__dict__[DONE_ATTR] = True
    note_device(ddp, rt)


def note_device(ddp: Any, rt: core.Runtime) -> None:
    """The GPU of the rank, from the first DDP model on one (the heartbeat's memory figure)."""
    if rt.cuda_device is None and ddp.device_ids and ddp.device_type == "cuda":
        rt.cuda_device = int(ddp.device_ids[0])


def install(runtime: core.Runtime) -> None:
    """After ddp_hooks.install (the bucket mode) and ddp_contract.install (activation.py)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    original_forward = DDP.forward
    if hasattr(original_forward, WRAPPED_MARK):
        return
    mode = (runtime.bucket_recording or {}).get("mode")
    record_buckets = mode == ddp_hooks.MODE_HOOK
    counting = ddp_contract.counts_syncs(runtime)
    register = DDP.register_comm_hook  # ddpdoctor's wrapper of it: the original underneath
    original_register = getattr(register, WRAPPED_MARK, register)
    tensor_type = torch.Tensor
    grad_enabled = torch.is_grad_enabled
    on_forward_error = ddp_errors.on_forward_error

    @functools.wraps(original_forward)
    def forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        rt = core._active
        probe_due: ddp_hooks.CommProbe | None = None
        now = 0.0
        if rt is not None:
            try:
                state = self.__dict__
                if grad_enabled():
                    # may train: the step counts once trained (steps.py), whatever `.training`
                    # says (Lightning keeps its DDP wrapper in eval mode while it trains)
                    if DONE_ATTR not in state:
                        first_forward(self, rt)
                    synced = self.require_backward_grad_sync
                    if synced and counting:
                        counted = state.get(SYNCS_ATTR)
                        if counted is None or counted.site_due:
                            ddp_contract.on_synced_forward(self, rt, counted)
                        else:
                            counted.count += 1
                    training = self.training
                    if record_buckets and state.get(SLOT_ATTR) is None:
                        ddp_hooks.ensure_hook(self, rt, original_register)
                    if training and rt.auto_phase and rt.phase != core.AUTO_TRAIN:
                        rt.set_phase(core.AUTO_TRAIN, auto=True)
                    first = inputs[0] if inputs else None
                    if isinstance(first, tensor_type):
                        batch = first.shape[0] if first.ndim else None
                    else:
                        batch = ddp_hooks.batch_size_of(inputs, kwargs)
                    steps = rt.steps
                    now = rt.mono_clock()
                    steps.on_forward(now, True, synced, batch, training)
                    if synced:
                        # this model's replica digest may be due (replicas.py); per model: with
                        # two models, the other's due step says nothing here
                        digests = state.get(DIGESTS_ATTR)
                        if digests is None or (digests and steps.steps_done >= digests.next_step):
                            replicas.due(self, rt)
                        if not record_buckets:
                            probe = state.get(PROBE_ATTR)
                            if probe is None:
                                ddp_hooks.start_probe(self, now, steps)
                            elif probe and now >= probe.next_t:
                                probe_due = probe  # read after DDP's forward: it records them
                else:
                    if rt.auto_phase and rt.phase != core.AUTO_EVAL:
                        rt.set_phase(core.AUTO_EVAL, auto=True)
                    rt.steps.on_forward(rt.mono_clock(), False, False, None)
                    note_device(self, rt)
            except Exception:  # noqa: BLE001 - recording must never break the forward
                pass
        try:
            out = original_forward(self, *inputs, **kwargs)
        except RuntimeError as exc:
            on_forward_error(self, exc)
            raise
        if probe_due is not None:
            try:  # DDP's _pre_forward just recorded the previous iteration's timers
                probe_due.read(self, rt.steps, now)  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001
                pass
        return out

    patch(runtime, DDP, "forward", forward, original_forward)
