"""died: a rank's process vanished without an exit event (killed, OOM killer, a signal, abort).

What the signal usually means comes from torchrun's failure table (exitcode -9 = SIGKILL, ...);
the rank's own last stderr lines (a C++ abort message, a faulthandler dump) are the evidence.
"""

from __future__ import annotations

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.model.snapshot import RankView

SIGNAL_MEANING = {
    "SIGKILL": (
        "killed by SIGKILL: usually the host's OOM killer, or an external kill (scheduler, user)",
        "Check `dmesg` / `journalctl -k` for 'Out of memory: Killed process <pid>'; reduce host "
        "memory per rank (dataset caching, DataLoader num_workers, pinned memory) or add RAM.",
    ),
    "SIGABRT": (
        "aborted (SIGABRT): a C++ error ended the process (see its stderr below)",
        "Read the rank's stderr: a 'terminate called after throwing' line names the C++ error "
        "(a gloo size mismatch means the ranks called different collectives).",
    ),
    "SIGSEGV": (
        "crashed with a segmentation fault (SIGSEGV)",
        "Look at the faulthandler dump in the rank's stderr; update or rebuild the extension "
        "that crashed; run it alone to reproduce.",
    ),
    "SIGBUS": (
        "crashed with SIGBUS: often /dev/shm is too small or full (DataLoader workers, NCCL SHM)",
        "Give the container more shared memory (`--shm-size`, /dev/shm) or lower num_workers.",
    ),
    "SIGTERM": (
        "was stopped with SIGTERM (sent by torchrun, the scheduler or a user)",
        "Find out what sent SIGTERM; torchrun sends it to survivors after another rank failed.",
    ),
}
GENERIC_FIX = (
    "The process ended without running Python's exit handlers (os._exit, a signal, or a crash "
    "in native code): look at its stderr log and at the system log for the reason."
)


RAY_FIX = (
    "Ray ends a worker only after its training function or method returned: this one was killed "
    "or crashed inside it. Ray's message about the worker in the driver's output says how "
    "('Worker exit type', 'exit detail', 'killed due to the node running low on memory'); "
    "`dmesg` or `journalctl -k` shows 'Killed process <pid>' for the kernel's OOM killer. Give "
    "the workers more memory (fewer per node, smaller batches) or find what killed the process."
)


def describe_death(view: RankView) -> tuple[str, str]:
    """(what happened, fix) for a rank that vanished."""
    sig = view.exit_signal
    if view.ray_call and sig is None and view.exit_code is None:
        call = "its training function" if view.ray_call == "train_fn" else view.ray_call
        return (
            f"its Ray worker process vanished while running {call}, without an exit event "
            "(killed: the OOM killer, Ray's memory monitor, a signal; or a crash)",
            RAY_FIX,
        )
    if sig in SIGNAL_MEANING:
        meaning, fix = SIGNAL_MEANING[sig]
        code = f" (exit code {view.exit_code})" if view.exit_code is not None else ""
        return f"its process {meaning}{code}", fix
    if view.exit_code is not None:
        if view.error_lines:
            return (
                f"it exited with code {view.exit_code} without an exit event (its stderr below "
                "says why; the error came before ddpdoctor's runtime could record it)",
                GENERIC_FIX,
            )
        return (
            f"it exited with code {view.exit_code} without a Python error or exit event "
            "(os._exit, or native code calling exit)",
            GENERIC_FIX,
        )
    return "its process vanished without an exit event (killed or crashed)", GENERIC_FIX


def finding(view: RankView) -> Finding:
    what, fix = describe_death(view)
    where = []
    if view.phase:
        where.append(f"phase {view.phase}")
    if view.step is not None:
        where.append(f"step {view.step}")
    summary = f"rank {view.rank} died: {what}"
    if where:
        summary += f"; it was in {', '.join(where)}"
    if view.last_event:
        summary += f", last event {view.last_event}"
    evidence = [Evidence(line.text, line.file, line.line_no) for line in view.error_lines]
    return Finding(
        id="died",
        severity=Severity.ERROR,
        summary=summary,
        fix=fix,
        ranks=(view.rank,),
        evidence=tuple(evidence),
    )
