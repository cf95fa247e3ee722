"""The live terminal UI (Textual): renders monitor snapshots, nothing else.

`run_tui(source, mode=..., job=...)` blocks until the user quits and returns the last snapshot it
showed. `source` is anything with `poll() -> Snapshot` and `request_stacks()` (the monitor);
`job` anything with `returncode()` and `stop()` (the launcher's TorchrunProcess). This is the
only package of ddpdoctor that imports textual, and it does so only when run_tui is called.
May import: the monitor's snapshots, stacks and the shared vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ddpdoctor.monitor.model.snapshot import Snapshot
    from ddpdoctor.tui.protocols import JobHandle, SnapshotSource

__all__ = ["run_tui"]


def run_tui(
    source: SnapshotSource,
    *,
    mode: Literal["run", "watch"] = "watch",
    job: JobHandle | None = None,
    title: str | None = None,
    refresh_s: float = 0.25,
) -> Snapshot:
    """Show the live view until the user quits; return the last snapshot shown.

    watch: quitting leaves the job alone. run: quitting while the job runs asks first and then
    calls `job.stop()` (the job is this process's child, so it cannot outlive it anyway). The
    source is not closed here: its owner closes it (and writes the final diagnosis).
    """
    from ddpdoctor.tui.app import DdpDoctorApp

    app = DdpDoctorApp(source, mode=mode, job=job, title=title, refresh_s=refresh_s)
    result = app.run()
    last = result if result is not None else app.snapshot
    # Quitting before the first poll came back still owes the caller a snapshot.
    return last if last is not None else source.poll()
