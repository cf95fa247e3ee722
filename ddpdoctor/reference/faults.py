"""Fault injection for the reference job (`--inject KIND:rank=R[,step=S][,seconds=X]`).

Every rank receives the same specs; each fault fires on its own rank at its step (1-based, the step
about to run) and is recorded as a `fault` event first, so the run directory shows the cause before
the aftermath:

    hang      block forever before the step's collectives (the heartbeat thread keeps beating)
    crash     raise InjectedCrash (an `error` event, exit code 1)
    exit      os._exit(EXIT_FAULT_CODE): no Python error, no `exit` event
    slow      sleep `seconds` in every step from `step` on: a straggler
    mismatch  an extra barrier on this rank only, while its peers enter the gradient all_reduce
    shape     this rank's metric all_reduce at that step has one element more than its peers'
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ddpdoctor.reference.inject import InjectSpec

EXIT_FAULT_CODE = 17
HANG_POLL_S = 0.5


class InjectedCrash(RuntimeError):
    """The exception `--inject crash:...` raises."""


def _inject_hang(sleep: Callable[[float], None] = time.sleep) -> None:
    """Block forever in Python (named so a py-spy stack says what this rank is doing)."""
    while True:
        sleep(HANG_POLL_S)


def _hard_exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@dataclass
class FaultHooks:
    """What the injector calls; tests replace these to observe a fault without suffering it."""

    record: Callable[[str, str, int], None]  # ddpdoctor.runtime.api.fault(spec_text, kind, step)
    extra_collective: Callable[[], object]  # the mismatch: a collective the peers never call
    sleep: Callable[[float], None] = time.sleep
    hang: Callable[[], None] = _inject_hang
    hard_exit: Callable[[int], None] = _hard_exit
    announce: Callable[[str], None] = field(
        default=lambda text: print(text, file=sys.stderr, flush=True)
    )


class FaultInjector:
    def __init__(self, specs: Sequence[InjectSpec], rank: int, hooks: FaultHooks) -> None:
        self.rank = rank
        self._all = tuple(specs)
        self._mine = tuple(s for s in specs if s.rank == rank)
        self._hooks = hooks
        self._recorded: set[InjectSpec] = set()

    @property
    def active(self) -> bool:
        return bool(self._mine)

    def sync_steps(self) -> frozenset[int]:
        """Steps at which every rank runs the metric all_reduce because some rank has a shape fault
        there (every rank knows every spec, so the peers join the collective the culprit garbles)."""
        return frozenset(s.step for s in self._all if s.kind == "shape")

    def before_step(self, step: int) -> None:
        """Fire this rank's faults for `step`, before any of the step's collectives."""
        for spec in self._mine:
            if spec.kind == "shape" or not spec.applies(self.rank, step):
                continue
            if spec.kind == "slow":
                if spec not in self._recorded:
                    self._record(spec, step, f"sleeping {spec.seconds:g} s in every step")
                self._hooks.sleep(spec.seconds or 0.0)
            elif spec.kind == "hang":
                self._record(spec, step, "blocking forever before its next collective")
                self._hooks.hang()
            elif spec.kind == "crash":
                self._record(spec, step, "raising an exception")
                raise InjectedCrash(
                    f"injected crash on rank {self.rank} at step {step} (--inject {spec.text})"
                )
            elif spec.kind == "exit":
                self._record(spec, step, f"exiting with code {EXIT_FAULT_CODE} (os._exit)")
                self._hooks.hard_exit(EXIT_FAULT_CODE)
            elif spec.kind == "mismatch":
                self._record(spec, step, "calling a barrier its peers never call")
                self._hooks.extra_collective()

    def sync_size(self, step: int, size: int) -> int:
        """The element count this rank all_reduces at `step`: one more under a shape fault."""
        for spec in self._mine:
            if spec.kind == "shape" and spec.applies(self.rank, step):
                self._record(spec, step, f"all_reducing {size + 1} elements instead of {size}")
                return size + 1
        return size

    def _record(self, spec: InjectSpec, step: int, what: str) -> None:
        self._recorded.add(spec)
        self._hooks.record(spec.text, spec.kind, step)
        self._hooks.announce(
            f"ddpdoctor reference job: rank {self.rank} step {step}: injected {spec.kind} "
            f"(--inject {spec.text}): {what}"
        )
