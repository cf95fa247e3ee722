"""A launch whose ranks raised before they joined a process group: a crash, not "not started".

A user's own command (`ddpdoctor run -- torchrun ... train.py`) records a rank from
`init_process_group` on, so a script that fails before it (GPU code on a machine without a GPU:
`torch.cuda.set_device` raises "Found no NVIDIA driver on your system") leaves no rank's events.
The job's logs still hold the tracebacks (explained as `python.exception`, with the user's
line) and torchrun's failure table (`torchrun.failed`, with the rank it saw fail first); when
both are there, the headline is that exception at its line. A traceback without torchrun's
word that a rank failed proves nothing (a process may print one and go on): that launch stays
for the ended-run verdicts. The launch has ended: this explains, it never
stops anything.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.model.snapshot import Snapshot, Verdict

_NO_GPU = re.compile(
    r"Found no NVIDIA driver|No CUDA GPUs are available|ProcessGroupNCCL is only supported with "
    r"GPUs|Torch not compiled with CUDA enabled|CUDA driver initialization failed"
)
_GPU_FIX = (
    "This machine has no usable GPU, and the script hard-codes CUDA or NCCL at that line: run it "
    'on a GPU machine, or let it fall back to the CPU: backend = "nccl" if '
    'torch.cuda.is_available() else "gloo"; device = torch.device("cuda", local_rank) if '
    'torch.cuda.is_available() else torch.device("cpu"); DDP(model, device_ids=[local_rank] '
    "if torch.cuda.is_available() else None). `ddpdoctor doctor --script SCRIPT` lists every "
    "such line before a launch."
)


def crash_before_init(snap: Snapshot) -> Snapshot | None:
    """CRASH with the ranks' exception at its line first, when the logs hold one; else None."""
    exception = next((f for f in snap.findings if f.id == "python.exception"), None)
    failed = next((f for f in snap.findings if f.id == "torchrun.failed"), None)
    if exception is None or failed is None:
        return None  # a traceback alone may have been printed by a process that went on
    culprits = exception.ranks or failed.ranks
    summary = exception.summary.removesuffix(".") + ", before joining a process group"
    fix = _GPU_FIX if _NO_GPU.search(exception.summary) else exception.fix
    first = Finding(
        "crash.before_init",
        Severity.ERROR,
        summary,
        fix,
        ranks=tuple(culprits),
        evidence=exception.evidence,
    )
    rest = tuple(f for f in snap.findings if f is not exception)
    return replace(
        snap,
        verdict=Verdict.CRASH,
        findings=(first, *rest),
        culprits=frozenset(culprits),
        finished=True,
    )
