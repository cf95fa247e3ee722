"""torch's ProcessGroupNCCL watchdog, heartbeat monitor and flight recorder lines.

A watchdog timeout is a symptom: every rank that waited reports one. Combined across ranks the
lines say which rank is behind (the lowest last-completed sequence number, or a rank that wrote no
watchdog line while its peers did) and whether ranks disagreed about the collective at one
sequence number (a mismatch).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from ddpdoctor.explain.lines import SourceLine
from ddpdoctor.explain.log_rules import Candidate, EvidenceList, ranks_text, rule
from ddpdoctor.findings import Finding, Severity

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\((?P<fields>.*?)\) ran for "
    r"(?P<ran>\d+) milliseconds"
)
_DETECTED = re.compile(
    r"(?:detected by watchdog at work|failure detected by watchdog at work sequence id|"
    r"Timeout at NCCL work): (?P<seq>\d+)"
)
_PROGRESS = re.compile(
    r"[Ll]ast enqueued (?:NCCL )?work: (?P<enq>-?\d+), last completed (?:NCCL )?work: "
    r"(?P<done>-?\d+)"
)
_FIELD = re.compile(r"(?P<key>SeqNum|OpType|NumelIn|NumelOut|Timeout\(ms\))=(?P<value>[\w-]+)")
_MESSAGE_RANK = re.compile(r"\[(?:PG (?:ID )?(?P<pg>\d+)[^\]]*?)?Rank (?P<rank>\d+)\]")

_BEHIND_FIX = (
    "Find out what that rank was doing (py-spy dump of it, or its last log lines): a rank-0-only "
    "evaluation or checkpoint, a data-loading stall, uneven batches across ranks, or a collective "
    "only some ranks call. Raise init_process_group(timeout=...) only for a phase that is "
    "legitimately long on one rank."
)

RULES = (
    rule(
        "watchdog.timeout",
        ERROR,
        r"Watchdog caught collective operation timeout|detected by watchdog at work|"
        r"Timeout at NCCL work",
        ["atchdog caught collective", "detected by watchdog", "Timeout at NCCL work"],
        emits=False,
        examples=(
            "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, "
            "NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for 600060 "
            "milliseconds before timing out.",
        ),
    ),
    rule(
        "watchdog.heartbeat_stuck",
        ERROR,
        r"(?:Rank (?P<rank>\d+)\]\s*)?(?:Heartbeat monitor timed out|ProcessGroupNCCL's "
        r"watchdog got stuck for (?P<secs>\d+) seconds)",
        ["Heartbeat monitor timed out", "watchdog got stuck"],
        lambda g: (
            "The NCCL heartbeat monitor killed the process: the watchdog thread itself was "
            "stuck"
            + (f" for {g['secs']} s" if g.get("secs") else "")
            + " (a NCCL/CUDA call hung, or another thread held the GIL inside a CUDA call)"
        ),
        "Debug the hang underneath: py-spy dump --native on the stuck rank shows the blocking "
        "CUDA/NCCL call. Raise TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC only for a false alarm.",
        rank_groups=("rank",),
        examples=(
            "[rank1]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 1] Heartbeat monitor timed out! "
            "Process will be terminated after dumping debug info. workMetaList_.size()=103",
        ),
    ),
    rule(
        "watchdog.teardown",
        INFO,
        r"taking the entire process down|Some NCCL operations have failed or timed out|"
        r"watchdog thread terminated with exception|Terminating the process after attempting to "
        r"dump debug info",
        ["entire process down", "Some NCCL operations", "terminated with exception", "Terminating"],
        "The NCCL watchdog took the process down after a failed or timed-out collective: a "
        "consequence, not the cause",
        "Look for the first watchdog timeout or NCCL error above these lines, and for the rank "
        "that was behind.",
        level="warn",
        consequence=True,
        examples=(
            "[E ProcessGroupNCCL.cpp:495] To avoid data inconsistency, we are taking the entire "
            "process down.",
        ),
    ),
    rule(
        "watchdog.flight_recorder_disabled",
        INFO,
        r"FlightRecorder is disabled",
        ["FlightRecorder is disabled"],
        "The NCCL flight recorder was off, so torch could not say where the failed collective was "
        "called",
        "For the next run set TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and TORCH_NCCL_DUMP_ON_TIMEOUT=1: "
        "on a timeout every rank dumps its recent collectives, and `torchfrtrace` compares them.",
        examples=(
            "[rank1]:[E626 16:48:25.440243908 ProcessGroupNCCL.cpp:670] Stack trace of the failed "
            "collective not found, potentially because FlightRecorder is disabled. You can enable "
            "it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.",
        ),
    ),
    rule(
        "watchdog.teardown",
        INFO,
        r"preparing to dump debug info",
        ["dump debug info"],
        emits=False,
        level="warn",
        examples=("[PG 0 Rank 1] ProcessGroupNCCL preparing to dump debug info.",),
    ),
)


@dataclass
class _Report:
    rank: int | None
    seq: int | None
    pg: str | None = None
    op: str | None = None
    numel_in: str | None = None
    timeout_ms: int | None = None
    last_enqueued: int | None = None
    last_completed: int | None = None
    lines: list[SourceLine] = field(default_factory=list)

    @property
    def progress(self) -> int | None:
        """The last collective this rank finished, as far as its lines say."""
        if self.last_completed is not None:
            return self.last_completed
        return self.seq - 1 if self.seq is not None else None


class WatchdogAnalyzer:
    def __init__(self) -> None:
        self.reports: dict[tuple[int | None, int | None], _Report] = {}
        self.seen: set[int] = set()

    def feed(self, line: SourceLine) -> None:
        text = line.text
        if (
            "atchdog" not in text
            and "ProcessGroupNCCL" not in text
            and "FlightRecorder" not in text
            and "entire process down" not in text
        ):
            return
        message_rank = _MESSAGE_RANK.search(text)
        rank = line.rank
        if rank is None and message_rank:
            rank = int(message_rank.group("rank"))
        if rank is not None:
            self.seen.add(rank)
        timeout = _TIMEOUT.search(text)
        detected = _DETECTED.search(text)
        if not timeout and not detected:
            return
        fields = (
            {m.group("key"): m.group("value") for m in _FIELD.finditer(timeout.group("fields"))}
            if timeout
            else {}
        )
        seq_text = fields.get("SeqNum") or (detected.group("seq") if detected else None)
        seq = int(seq_text) if seq_text and seq_text.isdigit() else None
        report = self.reports.get((rank, seq))
        if report is None:
            report = self.reports[(rank, seq)] = _Report(rank=rank, seq=seq)
        if message_rank and message_rank.group("pg") and report.pg is None:
            report.pg = message_rank.group("pg")
        if fields:
            report.op = report.op or fields.get("OpType")
            report.numel_in = report.numel_in or fields.get("NumelIn")
            timeout_ms = fields.get("Timeout(ms)")
            if timeout_ms and timeout_ms.isdigit():
                report.timeout_ms = int(timeout_ms)
        progress = _PROGRESS.search(text)
        if progress:
            report.last_enqueued = int(progress.group("enq"))
            report.last_completed = int(progress.group("done"))
        if len(report.lines) < 4:
            report.lines.append(line)

    def end_file(self, file: str | None) -> None:
        return None

    def finish(self) -> list[Candidate]:
        if not self.reports:
            return []
        reports = list(self.reports.values())
        out = [self._timeout(reports)]
        out.extend(c for c in (self._behind(reports), self._mismatch(reports)) if c is not None)
        return out

    def _timeout(self, reports: list[_Report]) -> Candidate:
        evidence = EvidenceList()
        by_seq: dict[int | None, list[_Report]] = {}
        for report in sorted(reports, key=_order):
            by_seq.setdefault(report.seq, []).append(report)
            for line in report.lines:
                evidence.add(line, _ranks(report.rank))
        parts = []
        for seq, group in by_seq.items():
            ranks = [r.rank for r in group if r.rank is not None]
            parts.append(f"{_describe(seq, group)} on {ranks_text(ranks)}")
        summary = "The NCCL watchdog caught a failed or timed-out collective: " + "; ".join(parts)
        timeouts = sorted({r.timeout_ms for r in reports if r.timeout_ms})
        if timeouts:
            summary += " (timeout " + ", ".join(f"{t / 1000:g} s" for t in timeouts) + ")"
        finding = Finding(
            id="watchdog.timeout",
            severity=Severity.ERROR,
            summary=summary,
            fix="The timeout is a symptom: the ranks above waited for a peer. " + _BEHIND_FIX,
            ranks=tuple(sorted(evidence.ranks)),
            evidence=evidence.evidence(),
        )
        return Candidate(finding)

    def _behind(self, reports: list[_Report]) -> Candidate | None:
        known = [r for r in reports if r.rank is not None and r.progress is not None]
        progress: dict[int, int] = {
            r.rank: r.progress for r in known if r.rank is not None and r.progress is not None
        }
        if progress and min(progress.values()) < max(progress.values()):
            low = min(progress.values())
            behind = sorted(rank for rank, done in progress.items() if done == low)
            ahead = max(progress.values())
            evidence = EvidenceList()
            for report in sorted(known, key=_order):
                if report.rank in behind:
                    for line in report.lines:
                        evidence.add(line, (report.rank,))
            summary = (
                f"{ranks_text(behind).capitalize()} is behind: its last completed collective is "
                f"#{low} while others completed #{ahead}"
            )
            return Candidate(_behind_finding(Severity.ERROR, summary, behind, evidence))
        if len(self.seen) < 2:
            return None
        missing = [r for r in range(max(self.seen)) if r not in self.seen]
        if not missing:
            return None
        summary = (
            f"{ranks_text(missing).capitalize()} wrote no watchdog line while "
            f"{ranks_text(self.seen)} did: the missing ranks are likely the ones behind (or their "
            "logs are not among the files read)"
        )
        evidence = EvidenceList()
        for report in sorted(reports, key=_order):
            for line in report.lines[:1]:
                evidence.add(line, ())
        return Candidate(_behind_finding(Severity.WARNING, summary, missing, evidence))

    def _mismatch(self, reports: list[_Report]) -> Candidate | None:
        by_seq: dict[int, dict[tuple[str, str | None], list[_Report]]] = {}
        for report in reports:
            if report.seq is None or report.op is None:
                continue
            by_seq.setdefault(report.seq, {}).setdefault((report.op, report.numel_in), []).append(
                report
            )
        for seq, kinds in sorted(by_seq.items()):
            if len(kinds) < 2:
                continue
            evidence = EvidenceList()
            sides = []
            for (op, numel), group in kinds.items():
                ranks = [r.rank for r in group if r.rank is not None]
                sides.append(
                    f"{ranks_text(ranks)}: {op}" + (f" of {numel} elements" if numel else "")
                )
                for report in group:
                    evidence.add(report.lines[0], _ranks(report.rank))
            finding = Finding(
                id="watchdog.mismatch",
                severity=Severity.ERROR,
                summary=f"Ranks disagree about collective #{seq}: " + "; ".join(sides),
                fix="Every rank must call the same collectives in the same order with the same "
                "sizes: look for rank-dependent branches, data-dependent shapes (pad them) or "
                "dicts reduced in different key order. TORCH_DISTRIBUTED_DEBUG=DETAIL names both "
                "sides immediately.",
                ranks=tuple(sorted(evidence.ranks)),
                evidence=evidence.evidence(),
            )
            return Candidate(finding)
        return None


def _describe(seq: int | None, group: list[_Report]) -> str:
    """ "ALLREDUCE #1580 (466119168 elements; last completed #1579)": what the ranks agree on."""
    kinds = Counter((r.op, r.numel_in) for r in group if r.op)
    op, numel = kinds.most_common(1)[0][0] if kinds else (None, None)
    text = f"{op or 'work'} #{seq}" if seq is not None else "a collective"
    notes = []
    if numel is not None:
        notes.append(f"{numel} element{'s' if numel != '1' else ''}")
    completed = {r.last_completed for r in group if r.last_completed is not None}
    if len(completed) == 1:
        notes.append(f"last completed #{completed.pop()}")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def _behind_finding(
    severity: Severity, summary: str, ranks: list[int], evidence: EvidenceList
) -> Finding:
    return Finding(
        id="watchdog.rank_behind",
        severity=severity,
        summary=summary,
        fix=_BEHIND_FIX,
        ranks=tuple(ranks),
        evidence=evidence.evidence(),
    )


def _order(report: _Report) -> tuple[int, int]:
    return (report.rank if report.rank is not None else -1, report.seq or 0)


def _ranks(rank: int | None) -> tuple[int, ...]:
    return () if rank is None else (rank,)
