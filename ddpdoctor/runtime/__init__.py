"""The in-rank runtime: code that runs INSIDE each rank and writes RUN_DIR/events/rank-<R>.jsonl.

    from ddpdoctor import runtime
    runtime.activate()            # no-op (None) unless $DDPDOCTOR_RUN_DIR is set

or, for a user's script, unchanged:

    torchrun --nproc-per-node 2 -m ddpdoctor.runtime.bootstrap train.py --lr 0.1

Once active, every rank records (the schema is ddpdoctor/protocol/events.py):

    writer.py       one JSON object a line, flushed per line, never raising into training
    records.py      hot-path events as tuples, encoded by the writer thread
    heartbeat.py    a daemon thread: step, phase, open collective, memory, once a second
    c10d_hooks.py   every torch.distributed collective and point-to-point call, numbered
    completion.py   when an op is over (return, future, Work, CUDA event)
    ddp_hooks.py    DDP gradient buckets (a comm hook) and training steps (forwards)
    data_hooks.py   DataLoader waits, epochs, the DistributedSampler set_epoch audit
    join_hooks.py   whether an epoch runs inside torch's `with Join(...)` (evened by design)
    exit_hooks.py   error events (excepthooks), faulthandler, the exit event
    signals.py      SIGTERM: an exit event, then the default death
    ptrace.py       lets py-spy of the same user attach (Yama ptrace_scope=1)
    api.py          phase() / log() / warn() / fault() for scripts that want to say more

Importing this package does not import torch; activate() does (a rank imports it anyway).
May import: the protocol (event schema, run directory) and the shared vocabulary only: it runs
inside the user's job, where nothing of the watcher belongs.
"""

from __future__ import annotations

from ddpdoctor.runtime import api
from ddpdoctor.runtime.activation import activate, deactivate
from ddpdoctor.runtime.core import Runtime, active

__all__ = ["Runtime", "activate", "active", "api", "current", "deactivate"]


def current() -> Runtime | None:
    """The active runtime of this process, or None."""
    return active()
