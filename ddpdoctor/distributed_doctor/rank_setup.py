"""What every phase of `doctor --distributed` on one rank needs: the rank's setup and its one
deadline, and the gloo calls abandoned past it (the process then ends with os._exit)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from ddpdoctor.checks.context import CheckContext
from ddpdoctor.checks.registry import Check
from ddpdoctor.launchers.identity import LaunchInfo

SLACK_S = 30.0  # extra wait for steps whose length depends on other ranks' work
GROUP_MIN_S = 2.0  # the least time the process group gets, even past the deadline
FOLLOW_GRACE_S = 3.0  # a rank other than 0 waits this much past its deadline for rank 0's word
Store = Any  # a torch.distributed Store (TCPStore or PrefixStore); torch is imported lazily


@dataclass(frozen=True)
class Setup:
    info: LaunchInfo
    checks: list[Check]
    context: CheckContext
    timeout_s: float
    strict: bool
    deadline: float = 0.0  # time.monotonic() by which rank 0 reports, whatever happened

    def left(self, *, grace: float = 0.0) -> float:
        return max(0.0, self.deadline + grace - time.monotonic())


ABANDONED: list[str] = []  # the calls left running past the deadline


def stuck_threads() -> list[str]:
    """The bounded calls this process left running (bounded_call's and the checks' daemon
    threads, a name lookup among them): the process then ends with os._exit."""
    return [
        t.name
        for t in threading.enumerate()
        if t.daemon and t.is_alive() and t.name.startswith(("ddpdoctor:", "ddpdoctor-", "check:"))
    ]
