"""torchrun's elastic agent: the ChildFailedError failure table and the agent's own lines.

The table's "Root Cause (first observed failure)" is the exit torchrun noticed first; the
"Failures" above it are usually peers it stopped with SIGTERM afterwards (consequences). A negative
exit code is a signal: -9 SIGKILL (OOM killer or an external kill), -6 SIGABRT, -7 SIGBUS, ...

Users paste excerpts, so a table may lack its headers: field lines after `<script> FAILED`, after
the Failures block or under a bare `[N]:` still make entries. Such an entry's role is unknown; when
no entry is marked as the root cause, the first one that was not stopped by SIGTERM is taken.
A table cut before its "Root Cause" part still names its failures: the first one that was not
stopped by SIGTERM is told, with its error file and the last frame of its traceback in the
user's code (with `@record`, torchrun prints the rank's traceback in the table), and with the
warning that the first failure is not in what was read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddpdoctor.explain.lines import SourceLine
from ddpdoctor.explain.log_rules import Candidate, EvidenceList, ranks_text, rule
from ddpdoctor.findings import Finding, Severity
from ddpdoctor.protocol.torchrun_logs import signal_name

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

_ENTRY = re.compile(r"^\[(?P<index>\d+)\]:\s*$")
# Pasted excerpts may lose the table's indentation; fields are only read inside a table.
_FIELD = re.compile(
    r"^\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)$"
)
_SCRIPT_FAILED = re.compile(r"^[^\s:]+ FAILED$")  # the table's title: `bug.py FAILED`
_RANK_FIELD = re.compile(r"(?P<rank>\d+)(?: \(local_rank: (?P<local>\d+)\))?")
_EXIT_FIELD = re.compile(r"(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?")
_AGENT_FAILED = re.compile(
    r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<local>\d+) \(pid: (?P<pid>\d+)\)"
)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_LIBRARY = ("site-packages/", "dist-packages/", "/lib/python", "<frozen ")
_LOCAL_RANK_ARG = re.compile(r"error: unrecognized arguments:.*--local[-_]rank=(?P<local>\d+)")

_SIGNAL_MEANING = {
    "SIGKILL": "was killed by SIGKILL: the kernel OOM killer or an external `kill -9`",
    "SIGABRT": "aborted (SIGABRT): a C++ exception or assertion, e.g. gloo's EnforceNotMet",
    "SIGSEGV": "crashed with a segmentation fault (SIGSEGV) in native code",
    "SIGBUS": "hit a bus error (SIGBUS): usually /dev/shm exhausted by DataLoader workers",
    "SIGTERM": "was terminated (SIGTERM) from outside: a scheduler limit, a timeout or a user",
    "SIGINT": "was interrupted (SIGINT)",
}
_SIGNAL_FIX = {
    "SIGKILL": "Check `dmesg -T | grep -i 'killed process'` or `journalctl -k` for 'Out of memory: "
    "Killed process <pid>' (containers: OOMKilled); reduce host memory per rank (DataLoader "
    "workers, dataset caching, pinned memory) or add RAM.",
    "SIGABRT": "Read that rank's stderr: the C++ message printed just before the abort "
    "('terminate called after throwing ...'), or the Python traceback that ended the rank (gloo's "
    "threads can abort a process that is already exiting on an exception).",
    "SIGSEGV": "Read that rank's stderr (faulthandler prints the Python stack); suspect native "
    "extensions, mismatched CUDA/driver versions, or a corrupted install.",
    "SIGBUS": "Give the job more shared memory (`docker run --shm-size=...` / --ipc=host) or use "
    "fewer DataLoader workers.",
    "SIGTERM": "Find out who sent it: the scheduler's time or memory limit, a preemption, or "
    "torchrun itself after another rank failed.",
}

RULES = (
    rule(
        "torchrun.failed",
        ERROR,
        r"failed \(exitcode: -?\d+\) local_rank: \d+|Root Cause \(first observed failure\)|"
        r"ChildFailedError",
        ["failed (exitcode:", "Root Cause", "ChildFailedError"],
        emits=False,
        examples=(
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 2) local_rank: "
            "0 (pid: 3049) of binary: /usr/bin/python3",
        ),
    ),
    rule(
        "torchrun.local_rank_arg",
        ERROR,
        r"error: unrecognized arguments:.*--local[-_]rank",
        ["unrecognized arguments"],
        emits=False,
        examples=("general_train.py: error: unrecognized arguments: --local-rank=0",),
    ),
    rule(
        "torchrun.sigterm_peers",
        INFO,
        r"Sending process (?P<pid>\d+) closing signal SIGTERM",
        ["closing signal SIGTERM"],
        "torchrun stopped its ranks with SIGTERM (after a rank failed, or because torchrun itself was stopped): a consequence",
        "Look at the Root Cause rank of torchrun's failure table, not at the ranks it stopped.",
        consequence=True,
        examples=(
            "W1122 04:11:38.009000 8954 torch/distributed/elastic/multiprocessing/api.py:1028] "
            "Sending process 8964 closing signal SIGTERM",
        ),
    ),
)


@dataclass
class _Failure:
    rank: int | None
    code: int | None
    pid: str | None
    host: str | None = None
    local_rank: int | None = None
    root_cause: bool | None = False  # None: from a table excerpt without its section headers
    from_agent: bool = False  # an agent log line, not a failure-table entry
    lines: list[SourceLine] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)  # the table fields read so far
    error_file: str | None = None
    traceback: list[str] = field(default_factory=list)  # the lines of its `traceback` field
    truncated: bool = False  # from the Failures of a table cut before its Root Cause part

    def user_frame(self) -> str | None:
        """ "bug.py:16 in main: dist.barrier()": the traceback's last frame in the user's code."""
        found = None
        for i, text in enumerate(self.traceback):
            match = _FRAME.match(text)
            if match and not any(m in match.group("file") for m in _LIBRARY):
                code = self.traceback[i + 1].strip() if i + 1 < len(self.traceback) else ""
                code = "" if _FRAME.match(code) else code
                found = f"{match.group('file')}:{match.group('line')} in {match.group('func')}"
                found += f": {code}" if code else ""
        return found

    @property
    def signal_name(self) -> str | None:
        if self.code is None or self.code >= 0:
            return None
        return signal_name(self.code)

    def describe(self) -> str:
        where = f"rank {self.rank}" if self.rank is not None else "a rank"
        details = [f"pid {self.pid}"] if self.pid else []
        if self.host:
            details.append(f"on {self.host}")
        return where + (f" ({', '.join(details)})" if details else "")


class TorchrunAnalyzer:
    """Parses failure tables and agent lines; folds them into one finding per root cause."""

    def __init__(self) -> None:
        self.failures: list[_Failure] = []
        self.local_rank_args: list[SourceLine] = []
        self._section: dict[str | None, str | None] = {}
        self._entry: dict[str | None, _Failure | None] = {}
        self._in_traceback: dict[str | None, bool] = {}
        self.root_header_seen = False

    def feed(self, line: SourceLine) -> None:
        body = line.body
        if "unrecognized arguments" in body and _LOCAL_RANK_ARG.search(body):
            self.local_rank_args.append(line)
        if "failed (exitcode:" in body:
            agent = _AGENT_FAILED.search(body)
            if agent:
                local = int(agent.group("local"))
                failure = _Failure(
                    rank=local,
                    code=int(agent.group("code")),
                    pid=agent.group("pid"),
                    local_rank=local,
                    from_agent=True,
                )
                failure.lines.append(line)
                self.failures.append(failure)
            return
        self._table_line(line)

    def _table_line(self, line: SourceLine) -> None:
        """One line of a failure table, whole or pasted in part (sections: root, failures, partial:
        an excerpt whose section header is missing)."""
        file = line.file
        stripped = line.body.strip()
        if stripped.endswith(" FAILED") and _SCRIPT_FAILED.match(stripped):
            self._section[file], self._entry[file] = "partial", None
            return
        if stripped.startswith("Root Cause (first observed failure)"):
            self._section[file], self._entry[file] = "root", None
            self.root_header_seen = True
            return
        if stripped == "Failures:":
            self._section[file], self._entry[file] = "failures", None
            return
        section = self._section.get(file)
        entry = _ENTRY.match(stripped) if stripped.startswith("[") else None
        if section is None and entry is None:  # the common case: a line outside any table
            return
        if stripped.startswith("===="):  # the table's closing border
            self._section[file] = self._entry[file] = None
            self._in_traceback[file] = False
            return
        field_match = _FIELD.match(line.body)
        if self._in_traceback.get(file) and field_match is None and entry is None:
            current = self._entry.get(file)
            if current is not None and not stripped.startswith("----") and stripped:
                if len(current.traceback) < 200:
                    current.traceback.append(line.body)
                return
        self._in_traceback[file] = False
        if stripped.startswith("----"):
            if section == "failures":  # the Root Cause header comes next, unless it was cut off
                self._section[file], self._entry[file] = "partial", None
            return
        if entry:
            self._section[file] = section = section or "partial"
            self._new_entry(file, section)
            return
        if field_match is None or section is None:
            return
        key = field_match.group("key")
        self._in_traceback[file] = key == "traceback"
        current = self._entry.get(file)
        # Without its `[N]:` line an entry starts at its first field; a field seen twice is the next.
        if current is None or key in current.keys:
            current = self._new_entry(file, section)
        self._table_field(current, key, field_match.group("value"), line)

    def _new_entry(self, file: str | None, section: str) -> _Failure:
        root = {"root": True, "failures": False}.get(section)
        failure = _Failure(rank=None, code=None, pid=None, root_cause=root)
        self.failures.append(failure)
        self._entry[file] = failure
        return failure

    @staticmethod
    def _table_field(failure: _Failure, key: str, value: str, line: SourceLine) -> None:
        failure.keys.add(key)
        if key == "host":
            failure.host = value.strip()
        elif key == "rank":
            match = _RANK_FIELD.match(value.strip())
            if match:
                failure.rank = int(match.group("rank"))
                if match.group("local"):
                    failure.local_rank = int(match.group("local"))
        elif key == "exitcode":
            match = _EXIT_FIELD.match(value.strip())
            if match:
                failure.code = int(match.group("code"))
                failure.pid = match.group("pid")
            failure.lines.append(line)
        elif key == "error_file":
            failure.error_file = value.strip() if value.strip() not in ("", "<N/A>") else None
        elif key == "traceback" and "Signal" in value:
            failure.lines.append(line)
        elif key == "traceback":
            failure.traceback.append(value)

    def end_file(self, file: str | None) -> None:
        self._section.pop(file, None)
        self._entry.pop(file, None)
        self._in_traceback.pop(file, None)

    def finish(self) -> list[Candidate]:
        table = [f for f in self.failures if not f.from_agent and f.code is not None]
        agents = [f for f in self.failures if f.from_agent]
        table_pids = {f.pid for f in table}
        # An agent line repeats what a table says: keep it as evidence of that entry.
        for agent in agents:
            for entry in table:
                if entry.pid == agent.pid:
                    entry.lines.insert(0, agent.lines[0])
        _pick_root_of_excerpt(table)
        loose = [a for a in agents if a.pid not in table_pids]
        # torchrun logs its agent line for the failure it saw first: with the table's Root
        # Cause part cut off, that line (when it was kept) still names it
        if not self.root_header_seen and not loose and not any(f.root_cause for f in table):
            _pick_root_of_truncated(table)
        roots = [f for f in table if f.root_cause]
        peers = [f for f in table if not f.root_cause]
        if not roots:
            roots, loose = loose[:1], loose[1:]
        out = []
        if self.local_rank_args and any(f.code == 2 for f in [*roots, *loose, *peers]):
            out.append(self._local_rank_arg([*roots, *loose, *peers]))
            return out
        for root in roots:
            out.append(_root_cause(root, peers if root.root_cause else loose))
        return out

    def _local_rank_arg(self, failures: list[_Failure]) -> Candidate:
        evidence = EvidenceList()
        for line in self.local_rank_args:
            evidence.add(line, [])
        for failure in failures:
            for line in failure.lines[:1]:
                evidence.add(line, () if failure.rank is None else (failure.rank,))
        finding = Finding(
            id="torchrun.local_rank_arg",
            severity=Severity.ERROR,
            summary="The script's argparse rejected `--local-rank=N`, which "
            "torch.distributed.launch passes in torch 2.x: every rank exited with code 2",
            fix="Launch with torchrun and read int(os.environ['LOCAL_RANK']) instead, or accept "
            "both spellings: parser.add_argument('--local-rank', '--local_rank', type=int).",
            ranks=tuple(sorted(evidence.ranks)),
            evidence=evidence.evidence(),
        )
        return Candidate(finding)


def _pick_root_of_excerpt(table: list[_Failure]) -> None:
    """Settle the role of entries read without a section header.

    When no entry is marked as the root cause (its header was cut off), the first unmarked entry
    that torchrun did not stop with SIGTERM is the culprit: stopped peers are consequences.
    """
    unknown = [f for f in table if f.root_cause is None]
    if not any(f.root_cause for f in table) and unknown:
        failed = [f for f in unknown if f.signal_name != "SIGTERM"]
        (failed or unknown)[0].root_cause = True
    for failure in unknown:
        if failure.root_cause is None:
            failure.root_cause = False


def _pick_root_of_truncated(table: list[_Failure]) -> None:
    """A table cut before its Root Cause part: its first failure not stopped by SIGTERM is
    told (it may be a consequence of the root cause that was cut off)."""
    failed = [f for f in table if f.signal_name != "SIGTERM"]
    if failed:
        failed[0].root_cause = failed[0].truncated = True


def _root_cause(root: _Failure, others: list[_Failure]) -> Candidate:
    evidence = EvidenceList()
    ranks = () if root.rank is None else (root.rank,)
    for line in root.lines:
        evidence.add(line, ranks)
    name = root.signal_name
    if name == "SIGKILL":
        finding_id, what = "torchrun.killed", _SIGNAL_MEANING["SIGKILL"]
    elif name is not None:
        finding_id = "torchrun.signal"
        what = _SIGNAL_MEANING.get(name, f"was ended by {name}")
    else:
        finding_id = "torchrun.failed"
        what = f"exited with code {root.code}"
        if root.code == 2:
            what += " (2 usually means argparse rejected the command line)"
    summary = f"{root.describe()[0].upper()}{root.describe()[1:]} {what}"
    frame = root.user_frame()
    if frame:
        summary += f"; its traceback ends in {frame}"
    if root.error_file:
        summary += f" (error file {root.error_file})"
    if root.truncated:
        summary += (
            " — torchrun's table was cut before its Root Cause part: the first failure is not "
            "in it, and this rank's error may be a consequence of it"
        )
    else:
        summary += " — the first failure torchrun observed"
    stopped = [o for o in others if o.signal_name == "SIGTERM"]
    also = [o for o in others if o.signal_name != "SIGTERM"]
    if stopped:
        summary += (
            f"; torchrun then stopped {ranks_text(o.rank for o in stopped if o.rank is not None)}"
        )
    if also:
        summary += f"; {ranks_text(o.rank for o in also if o.rank is not None)} also failed"
    for other in others:
        for line in other.lines[:1]:
            evidence.add(line, ranks)
    fix = _SIGNAL_FIX.get(name or "", "")
    if root.truncated:
        fix = (
            "Read the whole torchrun output (its Root Cause part names the rank that failed "
            "first) or that rank's error file; fix the first failure: errors of ranks that "
            "waited in a collective for it (a closed connection, a timeout) follow from it."
        )
    elif not fix:
        fix = (
            "Read that rank's own log for its traceback (torchrun --log-dir keeps it in "
            "attempt_N/<local_rank>/stderr.log); other ranks' errors after it are consequences."
        )
    finding = Finding(
        id=finding_id,
        severity=Severity.ERROR,
        summary=summary,
        fix=fix,
        ranks=tuple(ranks),
        evidence=evidence.evidence(),
    )
    return Candidate(finding)
