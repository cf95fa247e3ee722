"""A launch where no rank has started after a while: do the names it needs resolve?

torchrun's rendezvous store is advertised under this host's name (with --standalone too) and
reached under the rendezvous endpoint's or MASTER_ADDR's name; when one of them does not
resolve, the ranks retry for minutes and nothing says why. Once the job has run START_AFTER_S
without any rank starting, the launcher looks those names up, once, in a background thread, and
says which one does not resolve, with the resolver's answer (or that it has not answered).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.follow.net_watch import resolve

START_AFTER_S = 8.0
NO_ANSWER_S = 5.0  # a lookup still running this long is reported as not answering

FIX = (
    "Make the name resolve on every node: add it to /etc/hosts (`<address> <name>`) or to DNS, "
    "or give the address instead (--rdzv-endpoint ADDRESS:PORT, MASTER_ADDR=ADDRESS); torchrun "
    "advertises its store under this host's name, so that name must resolve to an address the "
    "ranks reach (`getent hosts NAME` checks it)."
)


class StartupNames:
    def __init__(self, names: Sequence[tuple[str, str]], clock=time.monotonic) -> None:
        self.names = list(names)
        self.clock = clock
        self._started: float | None = None
        self._thread: threading.Thread | None = None
        self._answers: dict[str, tuple[tuple[str, ...], str | None, float]] = {}
        self._lock = threading.Lock()

    def observe(self, no_rank_started: bool, elapsed_s: float | None) -> None:
        """At each poll: the lookups start once, when no rank has started START_AFTER_S in."""
        if self._started is not None or not self.names or not no_rank_started:
            return
        if elapsed_s is None or elapsed_s < START_AFTER_S:
            return
        self._started = self.clock()
        self._thread = threading.Thread(target=self._lookups, name="ddpdoctor-names", daemon=True)
        self._thread.start()

    def _lookups(self) -> None:
        for name, _role in self.names:
            answer = resolve(name)
            with self._lock:
                self._answers[name] = answer

    def findings(self, no_rank_started: bool) -> list[Finding]:
        """What the lookups said, while still no rank has started (then it explains that)."""
        if self._started is None or not no_rank_started:
            return []
        out = []
        waited = self.clock() - self._started
        with self._lock:
            answers = dict(self._answers)
        for name, role in self.names:
            if name in answers:
                addresses, error, took = answers[name]
                if addresses:
                    continue
                said = f"{role} {name} does not resolve ({error}, after {took:.1f} s)"
            elif waited >= NO_ANSWER_S:
                said = f"{role} {name} does not resolve: the resolver has not answered in {waited:.0f} s"
            else:
                continue
            out.append(
                Finding(
                    id="network.name_unresolved",
                    severity=Severity.WARNING,
                    summary=f"no rank has started, and {said}: the ranks cannot reach the "
                    "rendezvous store advertised under it",
                    fix=FIX,
                    ranks=(),
                    evidence=(Evidence(said),),
                )
            )
        return out
