"""What the app needs from the outside, as duck-typed protocols (no import of the monitor or launcher).

`ddpdoctor.monitor.Monitor` is a SnapshotSource and `ddpdoctor.launch.torchrun_process.TorchrunProcess` a JobHandle; tests pass
small fakes that return canned snapshots.
"""

from __future__ import annotations

from typing import Protocol

from ddpdoctor.monitor.model.snapshot import Snapshot


class SnapshotSource(Protocol):
    def poll(self) -> Snapshot:
        """Read what is new and return the current snapshot (file I/O: called off the event loop)."""
        ...

    def request_stacks(self) -> object:
        """Start a py-spy capture; its result shows in later snapshots' stacks / stack_status.

        May return False when a capture is already running (the monitor does)."""
        ...


class JobHandle(Protocol):
    def returncode(self) -> int | None:
        """None while the job runs; its exit status once it has ended."""
        ...

    def stop(self) -> None:
        """End the job (its whole process group)."""
        ...
