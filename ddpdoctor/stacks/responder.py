"""A launcher's side of the stack requests: capture this node's ranks when a watcher asks.

Each launcher of a job that spans nodes polls RUN_DIR/requests/ (one directory listing a second)
from its supervision loop. For a request that wants ranks of its own node, it captures them with
py-spy in a background thread (ddpdoctor.stacks.capture.capture_stacks: the dumps land in
RUN_DIR/stacks/<capture-id>/, the summary names this node as the capturer and the request it
answers), then writes its answer, `requests/<id>.node<N>.done`. Requests are answered one at a
time, once each, and never after their deadline; old ones are pruned now and then.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from ddpdoctor.background import BackgroundTask
from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.protocol.stack_requests import (
    Asker,
    StackAnswer,
    StackRequest,
    answered_by,
    prune,
    scan_requests,
    write_answer,
)

SCAN_EVERY_S = 1.0
PRUNE_EVERY_S = 60.0


class StackResponder:
    def __init__(
        self,
        run: RunDir,
        node_rank: int,
        *,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        capture: Callable[..., Any] | None = None,
    ) -> None:
        self.run = run
        self.node_rank = node_rank
        self.timeout_s = timeout_s
        self.me = Asker(socket.gethostname(), os.getpid(), "launcher", node_rank)
        self._clock = clock
        self._capture = capture
        self._task: BackgroundTask | None = None
        self._current: StackRequest | None = None
        self._wanted: tuple[int, ...] = ()
        self._done: set[str] = set()  # requests answered (or not ours to answer)
        self._scanned_t: float | None = None
        self._pruned_t: float | None = None
        self.answers: list[StackAnswer] = []  # what this launcher answered, oldest first

    @property
    def busy(self) -> bool:
        return self._task is not None

    def poll(self, mine: Mapping[int, int | None]) -> StackAnswer | None:
        """`mine`: the ranks of this node, rank -> pid (None once its process has ended).
        Returns the answer written in this call, if any."""
        written = self._finish()
        now = self._clock()
        if self._task is not None:
            return written
        if self._scanned_t is not None and 0 <= now - self._scanned_t < SCAN_EVERY_S:
            return written
        self._scanned_t = now
        if self._pruned_t is None or now - self._pruned_t >= PRUNE_EVERY_S:
            self._pruned_t = now
            prune(self.run, now=now)
        for request in scan_requests(self.run, now=now):
            if request.id in self._done:
                continue
            self._done.add(request.id)
            ours = [r for r in request.ranks if r in mine]
            if not ours or self._asked_by_me(request):
                continue
            if answered_by(self.run, request.id, self.node_rank):
                continue  # answered before (a restarted launcher)
            self._start(request, {r: mine[r] for r in ours})
            break
        return written

    def wait(self, timeout: float) -> StackAnswer | None:
        """Finish the capture in progress (bounded), e.g. before the launcher stops its job."""
        task = self._task
        if task is not None:
            task.wait(timeout)
        return self._finish()

    def _asked_by_me(self, request: StackRequest) -> bool:
        return request.asked_by.pid == self.me.pid and request.asked_by.host == self.me.host

    def _start(self, request: StackRequest, wanted: dict[int, int | None]) -> None:
        self._current = request
        self._wanted = tuple(sorted(wanted))
        alive = {rank: pid for rank, pid in wanted.items() if pid}
        gone = sorted(rank for rank, pid in wanted.items() if not pid)
        run, timeout, me = self.run, self.timeout_s, self.me
        capture_fn = self._capture

        def work():
            capture = None
            if alive:
                if capture_fn is None:
                    from ddpdoctor.stacks.capture import capture_stacks

                    fn = capture_stacks
                else:
                    fn = capture_fn
                capture = fn(
                    run,
                    alive,
                    timeout_s=timeout,
                    captured_by=me.to_json(),
                    request_id=request.id,
                )
            return capture, gone

        self._task = BackgroundTask("stack-answer", work)

    def _finish(self) -> StackAnswer | None:
        task, request = self._task, self._current
        if task is None or not task.done or request is None:
            return None
        self._task = self._current = None
        errors: dict[int, str] = {}
        captured: list[int] = []
        capture_id = None
        if task.error is not None:
            errors = {r: f"capture failed: {task.error}" for r in self._wanted}
        else:
            capture, gone = task.result
            errors.update({rank: "its process had ended" for rank in gone})
            if capture is not None:
                capture_id = capture.capture_id
                for entry in capture.ranks:
                    if entry.ok:
                        captured.append(entry.rank)
                    else:
                        errors[entry.rank] = entry.error or "no stack"
        answer = StackAnswer(
            request_id=request.id,
            node=self.node_rank,
            host=self.me.host,
            pid=self.me.pid,
            capture_id=capture_id,
            ranks=tuple(sorted(captured)),
            errors=tuple(sorted(errors.items())),
            answered_t=self._clock(),
        )
        try:
            write_answer(self.run, answer)
        except OSError:
            return None  # the run directory went away: nobody is left to read the answer
        self.answers.append(answer)
        return answer
