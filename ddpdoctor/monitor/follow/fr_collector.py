"""The monitor's side of the flight-recorder requests: when to ask the ranks for their dumps, and
reading their answers (ddpdoctor.protocol.fr_requests).

The monitor asks when it needs the backend's view: a rank has made no progress for longer than
the "waiting" threshold (a hang may be forming; its verdict needs a dump taken after the hang
threshold), a hang or mismatch verdict stands, or the user pressed `b` in the TUI. While the
suspicion lasts it asks again every few seconds, so that the dumps are fresh when the threshold
passes. A healthy job with short steps is never asked anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from ddpdoctor.monitor.model.snapshot import Snapshot, Verdict
from ddpdoctor.protocol.flight_recorder import FrRank, parse_dump
from ddpdoctor.protocol.fr_requests import FrAnswer, read_answers, write_request
from ddpdoctor.protocol.rundir import RunDir

# While a rank looks stuck, ask again this often (a beat answers within a second).
ASK_EVERY_S = 2.0
# Read the answers for this long after a request (then only after the next one).
READ_FOR_S = 15.0


def suspicious(snap: Snapshot) -> bool:
    """A live rank that joined a process group has shown no progress for longer than the waiting
    threshold, or a hang or mismatch verdict stands once a rank has joined one. A rank that has
    not joined has no flight recorder yet: while every rank waits at the start (a host lost
    there, a slow host's ranks still preparing) there is nothing to ask for."""
    if not any(view.joined for view in snap.ranks):
        return False
    # replicas that diverged (judge/rules/replicas.py) wait for nobody: nothing to dump for it
    diverged = bool(snap.findings) and snap.findings[0].id == "replicas.diverged"
    if snap.verdict in (Verdict.HANG, Verdict.MISMATCH) and not diverged:
        return True
    th = snap.thresholds
    if th is None:
        return False
    for view in snap.ranks:
        if view.state.finished or view.alive is False or view.last_progress_t is None:
            continue
        if not view.joined:
            continue
        if snap.taken_t - view.last_progress_t >= th.waiting_after_s:
            return True
    return False


class FrCollector:
    def __init__(self, run: RunDir, *, clock: Callable[[], float] = time.time) -> None:
        self.run = run
        self.clock = clock
        self.asked_t: float | None = None
        self.asks = 0
        self._dumps: dict[int, FrRank] = {}
        self._seen: dict[int, tuple[str, float]] = {}  # rank -> (request id, taken_t) parsed
        self._loaded = False
        self.error: str | None = None

    @property
    def dumps(self) -> tuple[FrRank, ...]:
        return tuple(self._dumps[r] for r in sorted(self._dumps))

    def ask(self, now: float | None = None) -> bool:
        """Ask every rank for its dump now (the TUI's `b`, a verdict, a suspicion)."""
        moment = self.clock() if now is None else now
        try:
            write_request(self.run, now=moment)
        except OSError as exc:
            self.error = f"cannot ask for flight-recorder dumps: {exc.strerror or exc}"
            return False
        self.asked_t = moment
        self.asks += 1
        return True

    def maybe_ask(self, snap: Snapshot, now: float) -> bool:
        if not snap.live or not suspicious(snap):
            return False
        if self.asked_t is not None and 0.0 <= now - self.asked_t < self._next_in(snap):
            return False
        return self.ask(now)

    def _next_in(self, snap: Snapshot) -> float:
        """Seconds from the last request to the next: ASK_EVERY_S, or less when a collective the
        last dumps showed pending reaches the hang threshold sooner (the verdict needs a dump
        taken after that moment)."""
        asked, th = self.asked_t, snap.thresholds
        wait = ASK_EVERY_S
        if asked is None or th is None:
            return wait
        # the sooner threshold (every rank behind blocked) wants a dump by then too
        soonest = min(th.hang_after_s, th.hang_blocked_after_s or th.hang_after_s)
        for d in self._dumps.values():
            for group in d.groups:
                entry = d.pending(group.pg)
                if entry is None or entry.created_t is None:
                    continue
                for after in (soonest, th.hang_after_s):
                    due = entry.created_t + after + 0.05 - asked
                    if 0.0 < due < wait:
                        wait = due
                        break
        return wait

    def collect(self, now: float) -> tuple[FrRank, ...]:
        """Read new answers (after a request, and once for a run directory read post-mortem)."""
        recent = self.asked_t is not None and now - self.asked_t < READ_FOR_S
        if not recent and self._loaded:
            return self.dumps
        self._loaded = True
        for rank, answer in read_answers(self.run).items():
            key = (answer.request_id, answer.taken_t)
            if self._seen.get(rank) == key:
                continue
            self._seen[rank] = key
            parsed = parse_answer(answer)
            if parsed is not None:
                self._dumps[rank] = parsed
        return self.dumps

    def status(self) -> str | None:
        if self.error:
            return self.error
        if self.asked_t is None:
            return f"{len(self._dumps)} dumps on record" if self._dumps else None
        answered = sum(1 for d in self._dumps.values() if d.taken_t >= self.asked_t - 1.0)
        clock = time.strftime("%H:%M:%S", time.localtime(self.asked_t))
        return f"asked {clock}, {answered} ranks answered"


def parse_answer(answer: FrAnswer) -> FrRank | None:
    if answer.dump is None:
        return FrRank(
            rank=answer.rank,
            request_id=answer.request_id,
            taken_t=answer.taken_t,
            error=answer.error or "no dump",
            step=answer.step,
        )
    try:
        return replace(
            parse_dump(
                answer.dump, rank=answer.rank, request_id=answer.request_id, taken_t=answer.taken_t
            ),
            step=answer.step,
        )
    except ValueError:
        return None
