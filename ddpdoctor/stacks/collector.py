"""py-spy stacks for the monitor: captured in the background, grouped, folded into snapshots.

A capture round runs ddpdoctor.stacks.capture.capture_stacks on the ranks this watcher can reach
(bounded in time) in a daemon thread, and asks for the others through the run directory
(ddpdoctor.protocol.stack_requests): the launcher of each of their nodes captures its own ranks and answers.
The poller folds in what has arrived on each poll, so a poll never waits for py-spy or for another
node: the round's stacks, grouped across nodes, grow as answers come, with a status saying which
ranks are still missing and, past the deadline, which node's launcher did not answer.

A post-mortem shows the latest stored round: the latest capture in RUN_DIR/stacks/, together with
the captures other nodes stored for the same request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor.background import BackgroundTask
from ddpdoctor.findings import Finding, Severity
from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.stacks.groups import StackGroup

NO_ANSWER_FIX = (
    "Start every node with `ddpdoctor run ... --run-dir DIR` on the same shared DIR (its launcher "
    "answers stack requests while its job runs), or run `ddpdoctor watch DIR` on that node."
)


def _plural(n: int, word: str = "rank") -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _rank_list(ranks) -> str:
    return ", ".join(map(str, sorted(ranks)))


@dataclass
class _Round:
    """One capture round: the local capture, plus the ranks asked of other nodes."""

    started: str  # HH:MM:SS
    local: Any = None  # StackCapture of the ranks captured here
    local_done: bool = True
    request: Any = None  # StackRequest, when other nodes were asked
    remote: dict[int, int | None] = field(default_factory=dict)  # rank -> node (None: unknown)
    answers: dict[int, Any] = field(default_factory=dict)  # node -> StackAnswer
    remote_ranks: dict[int, Any] = field(default_factory=dict)  # rank -> RankStacks
    remote_findings: list[Finding] = field(default_factory=list)
    by_node: dict[int, int] = field(default_factory=dict)  # rank -> node that captured it
    expired: bool = False
    local_error: str | None = None  # why the capture here failed (other nodes' answers stand)

    @property
    def waiting_for(self) -> list[int]:
        return sorted(set(self.remote) - set(self.remote_ranks))

    @property
    def pending(self) -> bool:
        return not self.local_done or (
            self.request is not None and bool(self.waiting_for) and not self.expired
        )


class StackCollector:
    def __init__(
        self,
        run: RunDir,
        *,
        timeout_s: float = 10.0,
        asker: Any = None,
        request_timeout_s: float | None = None,
        clock: Callable[[], float] = time.time,
        launcher_ended: Callable[[int], bool] | None = None,
    ) -> None:
        self.run = run
        self.timeout_s = timeout_s
        # Who asks other nodes (ddpdoctor.protocol.stack_requests.Asker); None: never ask.
        self.asker = asker
        # Launchers poll requests every second and py-spy takes up to timeout_s.
        self.request_timeout_s = request_timeout_s or timeout_s + 8.0
        self._clock = clock
        self._launcher_ended = launcher_ended
        self.groups: tuple[StackGroup, ...] = ()
        self.findings: tuple[Finding, ...] = ()
        self.status: str | None = None
        self.captures = 0
        self._task: BackgroundTask | None = None
        self._round: _Round | None = None

    @property
    def busy(self) -> bool:
        return (self._task is not None and not self._task.done) or (
            self._round is not None and self._round.pending
        )

    @property
    def last_request(self):
        """The stack request of the latest round, if it asked other nodes."""
        return self._round.request if self._round is not None else None

    def start(
        self, targets: Mapping[int, int], *, remote: Mapping[int, int | None] | int = 0
    ) -> bool:
        """Capture the stacks of `targets` (rank -> pid) here, in the background, and ask the
        launchers of the `remote` ranks (rank -> node) for theirs."""
        if self.busy:
            return False
        remote_map = dict(remote) if isinstance(remote, Mapping) else {}
        unreachable = remote if isinstance(remote, int) else len(remote_map)
        ask = self.asker is not None and bool(remote_map)
        if not targets and not ask:
            self.status = (
                f"no local rank to capture ({unreachable} on other hosts)"
                if unreachable
                else "no rank alive to capture"
            )
            return False
        rnd = _Round(started=time.strftime("%H:%M:%S"))
        if ask:
            from ddpdoctor.protocol.stack_requests import write_request

            try:
                rnd.request = write_request(
                    self.run,
                    remote_map,
                    asked_by=self.asker,
                    timeout_s=self.request_timeout_s,
                    now=self._clock(),
                )
                rnd.remote = remote_map
            except OSError as exc:
                self.status = f"cannot ask other nodes for stacks: {exc.strerror or exc}"
                if not targets:
                    return False
        self._round = rnd
        if targets:
            rnd.local_done = False
            self._start_local(dict(targets), rnd)
        self._update_status()
        return True

    def _start_local(self, wanted: dict[int, int], rnd: _Round) -> None:
        run, timeout = self.run, self.timeout_s
        extra: dict[str, Any] = {}
        if self.asker is not None:
            extra["captured_by"] = self.asker.to_json()
        if rnd.request is not None:
            extra["request_id"] = rnd.request.id

        def work():
            from ddpdoctor.stacks.capture import capture_stacks, group_stacks

            capture = capture_stacks(run, wanted, timeout_s=timeout, **extra)
            return capture, group_stacks(capture)

        self._task = BackgroundTask("stacks", work)

    def collect(self) -> bool:
        """Fold in a finished local capture and the answers of other nodes; True on a change."""
        changed = False
        rnd = self._round
        task = self._task
        if task is not None and task.done:
            self._task = None
            changed = True
            if rnd is not None:
                rnd.local_done = True
            if task.error is not None:
                self.status = f"stack capture failed: {type(task.error).__name__}: {task.error}"
                if rnd is None or rnd.request is None:
                    return True
                rnd.local_error = self.status  # kept in the round's status, beside the answers
            else:
                capture, groups = task.result
                self.captures += 1
                if rnd is None or rnd.request is None:
                    self._fold(capture, groups)
                    return True
                rnd.local = capture
        if rnd is None or rnd.request is None:
            return changed
        if not rnd.expired and rnd.waiting_for:
            changed = self._fold_answers(rnd) or changed
            if rnd.waiting_for and self._clock() >= rnd.request.deadline_t:
                rnd.expired = True
                changed = True
        if changed:
            self._fold_round(rnd)
        return changed

    def _fold_answers(self, rnd: _Round) -> bool:
        from ddpdoctor.protocol.stack_requests import read_answers
        from ddpdoctor.stacks.capture import load_capture

        changed = False
        for node, answer in read_answers(self.run, rnd.request.id).items():
            if node in rnd.answers:
                continue
            rnd.answers[node] = answer
            changed = True
            wanted = set(rnd.remote) & (set(answer.ranks) | {r for r, _ in answer.errors})
            stored = None
            if answer.capture_id:
                try:
                    stored = load_capture(self.run.stacks_dir / answer.capture_id)
                except Exception:  # noqa: BLE001 - a damaged answer counts as errors below
                    stored = None
            for rank in sorted(wanted):
                entry = stored.rank(rank) if stored is not None else None
                if entry is None:
                    from ddpdoctor.stacks.groups import RankStacks

                    why = dict(answer.errors).get(rank, "no dump stored")
                    entry = RankStacks(rank, 0, error=f"node {node}: {why}")
                rnd.remote_ranks[rank] = entry
                rnd.by_node[rank] = node
            if stored is not None:
                rnd.remote_findings.extend(stored.findings)
        return changed

    def _fold_round(self, rnd: _Round) -> None:
        from ddpdoctor.stacks.groups import StackCapture, group_stacks

        local = rnd.local
        ranks = {r.rank: r for r in (local.ranks if local is not None else ())}
        ranks.update(rnd.remote_ranks)
        merged = StackCapture(
            capture_id=local.capture_id if local is not None else rnd.request.id,
            path=local.path if local is not None else None,
            taken_t=local.taken_t if local is not None else rnd.request.created_t,
            ranks=tuple(sorted(ranks.values(), key=lambda r: r.rank)),
            findings=tuple(local.findings if local is not None else ()),
        )
        self.groups = tuple(group_stacks(merged))
        findings = list(merged.findings) + [
            f for f in rnd.remote_findings if f not in merged.findings
        ]
        missing = rnd.waiting_for if rnd.expired else []
        if missing:
            findings.append(self._no_answer_finding(rnd, missing))
        self.findings = tuple(findings)
        self._update_status()

    def _no_answer_finding(self, rnd: _Round, missing: list[int]) -> Finding:
        return Finding(
            id="stacks.node_no_answer",
            severity=Severity.WARNING,
            summary="No stack for rank(s) "
            + _rank_list(missing)
            + ": "
            + "; ".join(self._silent_nodes(rnd, missing)),
            fix=NO_ANSWER_FIX,
            ranks=tuple(missing),
        )

    def _silent_nodes(self, rnd: _Round, missing: list[int]) -> list[str]:
        by_node: dict[int | None, list[int]] = {}
        for rank in missing:
            by_node.setdefault(rnd.remote.get(rank), []).append(rank)
        waited = f"{self.request_timeout_s:g} s"
        out = []
        for node, ranks in sorted(by_node.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            if node is None:
                out.append(f"no launcher is known for rank(s) {_rank_list(ranks)}")
            elif self._launcher_ended is not None and self._launcher_ended(node):
                out.append(f"node {node}'s launcher had ended")
            else:
                out.append(f"node {node}'s launcher did not answer within {waited}")
        return out

    def _update_status(self) -> None:
        rnd = self._round
        if rnd is None:
            return
        local = rnd.local.ranks if rnd.local is not None else ()
        got = {r.rank for r in local if r.ok} | {r for r, e in rnd.remote_ranks.items() if e.ok}
        if rnd.pending:
            # "capturing" while anything is outstanding: the launcher waits for it (supervise.py)
            parts = [] if rnd.local_done else ["here"]
            waiting = rnd.waiting_for
            if waiting:
                nodes = sorted({rnd.remote.get(r) for r in waiting}, key=lambda n: (n is None, n))
                named = ", ".join("node ?" if n is None else f"node {n}" for n in nodes)
                parts.append(f"waiting for rank(s) {_rank_list(waiting)} from {named}")
            self.status = f"capturing stacks ({len(got)} in; {'; '.join(parts)})…"
            return
        text = f"captured {_plural(len(got))} at {rnd.started}"
        remote_got = sorted(r for r, e in rnd.remote_ranks.items() if e.ok)
        if remote_got:
            by = sorted({rnd.by_node[r] for r in remote_got})
            text += f" ({_plural(len(remote_got))} by node {', '.join(map(str, by))}'s launcher)"
        missing = rnd.waiting_for if rnd.expired else []
        if missing:
            text += f"; no answer for rank(s) {_rank_list(missing)}"
        if rnd.local_error:
            text += f"; here: {rnd.local_error}"
        self.status = text

    def wait(self, timeout: float) -> bool:
        """Wait (bounded) until the round is in: the local capture and the answers asked for."""
        deadline = time.monotonic() + timeout
        task = self._task
        if task is not None:
            task.wait(max(0.0, deadline - time.monotonic()))
        self.collect()
        while self.busy and time.monotonic() < deadline:
            time.sleep(0.2)
            self.collect()
        return not self.busy

    def load_latest(self) -> bool:
        """The latest capture round stored in the run directory (post-mortem); False when none."""
        folder = self.run.stacks_dir
        try:
            captures = sorted(
                (p for p in folder.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime
            )
        except OSError:
            return False
        from ddpdoctor.stacks.capture import group_stacks, load_capture, read_summary

        for path in reversed(captures):
            try:
                round_id = read_summary(path).get("request_id")
                members = [path]
                if isinstance(round_id, str):
                    members = [p for p in captures if read_summary(p).get("request_id") == round_id]
                capture = _merge([load_capture(p) for p in members])
                self._fold(capture, group_stacks(capture), stored=_names(members))
                return True
            except Exception:  # noqa: BLE001 - a damaged capture: try the one before
                continue
        return False

    def _fold(self, capture, groups, *, stored: str | None = None) -> None:
        self.groups = tuple(groups)
        findings = list(getattr(capture, "findings", ()) or ())
        single = getattr(capture, "finding", None)
        if single is not None:
            findings.append(single)
        self.findings = tuple(f for f in findings if isinstance(f, Finding))
        ranks = sorted({r for g in self.groups for r in g.ranks})
        errors = getattr(capture, "errors", None) or {}
        when = time.strftime("%H:%M:%S")
        if stored:
            self.status = f"stacks from capture {stored}"
        elif ranks:
            self.status = f"captured {_plural(len(ranks))} at {when}"
        elif self.findings:
            self.status = self.findings[0].summary
        else:
            self.status = f"no stacks captured at {when}"
        if errors and not stored:
            self.status += f" ({len(errors)} failed)"


def _names(paths: list[Path]) -> str:
    return " + ".join(p.name for p in paths)


def _merge(captures: list[Any]):
    """One StackCapture of several (the captures of one round, taken on several nodes): for each
    rank, a successful dump wins over an error."""
    from ddpdoctor.stacks.groups import StackCapture

    if len(captures) == 1:
        return captures[0]
    ranks: dict[int, Any] = {}
    findings: list[Finding] = []
    for capture in captures:
        for entry in capture.ranks:
            if entry.rank not in ranks or (entry.ok and not ranks[entry.rank].ok):
                ranks[entry.rank] = entry
        findings.extend(f for f in capture.findings if f not in findings)
    latest = max(captures, key=lambda c: c.taken_t)
    return StackCapture(
        capture_id=latest.capture_id,
        path=latest.path,
        taken_t=latest.taken_t,
        ranks=tuple(sorted(ranks.values(), key=lambda r: r.rank)),
        findings=tuple(findings),
    )
