"""The model of a run: tail the run directory -> events -> RunState -> frozen Snapshot; diagnosis
rules; log explainers; py-spy stacks. Never imports textual: everything here works without a terminal.

    Monitor(run_dir, hang_after=None, capture_stacks=True)   .poll() / .request_stacks() / .close()
    diagnose_run_dir(path) -> Snapshot                        the post-mortem of a run directory
"""

from __future__ import annotations

from ddpdoctor.monitor.diagnose import diagnose_run_dir
from ddpdoctor.monitor.monitor import Monitor

__all__ = ["Monitor", "diagnose_run_dir"]
