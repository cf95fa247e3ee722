"""explain_lines / explain_files: feed lines to every analyzer, then decide what explains what."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from ddpdoctor.errors import UsageError
from ddpdoctor.explain.catalog import new_analyzers
from ddpdoctor.explain.flight_recorder import explain_dumps
from ddpdoctor.explain.lines import (
    FileContext,
    SourceLine,
    iter_file_lines,
    local_rank_from_path,
    nccl_file_owner,
)
from ddpdoctor.explain.log_rules import Analyzer, Candidate
from ddpdoctor.findings import Finding, Severity, sort_findings
from ddpdoctor.protocol import bounded
from ddpdoctor.protocol.events import parse_event_line
from ddpdoctor.protocol.flight_recorder import FrRank
from ddpdoctor.protocol.fr_files import DumpError, is_dump_file, load_dump
from ddpdoctor.protocol.node_records import NodeRecord, read_node_records
from ddpdoctor.protocol.rundir import RunDir
from ddpdoctor.protocol.torchrun_logs import classify_log_path

_RUN_DIR_MARKERS = ("logs", "nccl", "events", "run.json")
_HELLO_SCAN_LINES = 50  # the hello event is a rank's first; never read far for it


class Explainer:
    """One explain run: lines from any number of files, combined into findings at the end."""

    def __init__(self, *, one_host: bool = False) -> None:
        # one_host: the logs are of a job on one machine, where loopback is the right address
        self.analyzers: list[Analyzer] = new_analyzers(one_host=one_host)
        self.lines_read = 0

    def feed_file(self, lines: Iterable[SourceLine], file: str | None) -> None:
        for line in lines:
            self.lines_read += 1
            for analyzer in self.analyzers:
                analyzer.feed(line)
        for analyzer in self.analyzers:
            analyzer.end_file(file)

    def findings(self) -> list[Finding]:
        candidates = [c for analyzer in self.analyzers for c in analyzer.finish()]
        return resolve(candidates)


def resolve(candidates: list[Candidate]) -> list[Finding]:
    """Drop generic findings a specific one explains; demote consequences of a root cause."""
    root_ids = [
        c.finding.id
        for c in candidates
        if not c.generic and not c.consequence and c.finding.severity is Severity.ERROR
    ]
    kept = []
    for c in candidates:
        if c.generic and c.explained_by and any(i.startswith(c.explained_by) for i in root_ids):
            continue
        kept.append(c)
    has_root = any(c.finding.severity is Severity.ERROR and not c.consequence for c in kept)
    findings = []
    for c in kept:
        finding = c.finding
        if c.consequence and has_root and finding.severity is Severity.ERROR:
            finding = replace(finding, severity=Severity.WARNING)
        findings.append(finding)
    return sort_findings(findings)


def explain_lines(lines: Iterable[str], file: str | None = None) -> list[Finding]:
    """Findings for lines of one log (`file` labels the evidence; its path may name the rank)."""
    context = _plain_context(file) if file else FileContext(label=None)
    explainer = Explainer()
    explainer.feed_file(
        (context.make_line(text.rstrip("\r\n"), n) for n, text in enumerate(lines, 1)), file
    )
    return explainer.findings()


@dataclass(frozen=True)
class ExplainResult:
    findings: tuple[Finding, ...]
    files: int
    lines: int


def explain_files(paths: Iterable[str | os.PathLike[str]]) -> list[Finding]:
    """Findings for log files and run directories (RUN_DIR/logs/** and RUN_DIR/nccl/*), combined."""
    return list(explain_paths(paths).findings)


def explain_paths(paths: Iterable[str | os.PathLike[str]]) -> ExplainResult:
    """explain_files, plus how much was read (for the command's closing line). Flight-recorder
    dumps among the files are read as dumps and told with the logs as one story."""
    paths = list(paths)
    explainer = Explainer(one_host=_one_host_runs(paths))
    files = 0
    dumps: list[FrRank] = []
    for path, context in expand_paths(paths):
        if is_dump_file(path, follow=context.named):
            try:
                dumps.append(load_dump(path, follow=context.named))
            except DumpError as exc:
                raise UsageError(str(exc)) from None
            files += 1
            continue
        try:
            explainer.feed_file(iter_file_lines(path, context, follow=context.named), context.label)
        except FileNotFoundError:
            continue  # a file of a live run directory that went away: nothing to explain
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
        files += 1
    findings = explainer.findings()
    if dumps:
        findings = explain_dumps(_one_per_rank(dumps), findings)
    return ExplainResult(tuple(findings), files, explainer.lines_read)


def _one_host_runs(paths: list[str | os.PathLike[str]]) -> bool:
    """Every path is a run directory of a job on one machine: its launch says one node
    (run.json's nnodes), or, without it, every rank's hello names the same host."""
    if not paths:
        return False
    for given in paths:
        root = Path(given)
        if not root.is_dir() or not any((root / m).exists() for m in _RUN_DIR_MARKERS):
            return False
        nnodes = RunDir(root).read_run_json().get("nnodes")
        if isinstance(nnodes, int) and not isinstance(nnodes, bool):
            if nnodes != 1:
                return False
            continue
        if len(_hello_index(root / "events").hosts) != 1:
            return False
    return True


def _one_per_rank(dumps: list[FrRank]) -> list[FrRank]:
    """A rank dumped twice (the pickle and its JSON form, or two requests): its latest dump,
    the one with the most entries when their times are not known."""
    best: dict[int, FrRank] = {}
    for d in dumps:
        old = best.get(d.rank)
        if old is None or (d.taken_t, len(d.entries)) > (old.taken_t, len(old.entries)):
            best[d.rank] = d
    return [best[r] for r in sorted(best)]


def expand_paths(paths: Iterable[str | os.PathLike[str]]) -> Iterator[tuple[Path, FileContext]]:
    """Every file to read, once each (a file given twice, or inside a directory given too)."""
    seen: set[Path] = set()
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = list(_directory_files(path))
        elif path.exists():
            _check_readable(path)
            found = [(path, replace(_plain_context(str(path)), named=True))]
        else:
            raise UsageError(f"cannot read {given}: no such file or directory")
        for file, context in found:
            key = file.resolve()
            if key not in seen:
                seen.add(key)
                yield file, context


def _check_readable(path: Path) -> None:
    """A regular file this user can read. A FIFO would block the open until a writer comes, a
    device (/dev/zero) never ends: neither is a log."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"cannot read {path}: not a regular file (explain reads log files)")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


def _plain_context(label: str) -> FileContext:
    return FileContext(label=label, rank=local_rank_from_path(label))


def _directory_files(root: Path) -> Iterator[tuple[Path, FileContext]]:
    if any((root / marker).exists() for marker in _RUN_DIR_MARKERS):
        hello = _hello_index(root / "events", read_node_records(RunDir(root)))
        for sub in ("logs", "nccl"):
            for path in _files_under(root / sub):
                yield path, _run_dir_context(root, path, hello)
        # RUN_DIR/flight_recorder/ is left out: the monitor asks for dumps whenever a rank waits
        # a while, so they hold moments of a healthy run too (rank 1 in a barrier while rank 0
        # evaluates); the run's diagnosis.json says what they meant
        return
    for path in _files_under(root):
        yield path, _plain_context(str(path))


def _files_under(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(
            Path(dirpath) / name
            for name in sorted(filenames)
            if not name.startswith(".") and _regular(Path(dirpath) / name)
        )
    return found


def _regular(path: Path) -> bool:
    """Only regular files inside a directory: a FIFO, a device or a symlink there is skipped,
    not read."""
    return bounded.is_regular(path)


def _run_dir_context(root: Path, path: Path, hello: _HelloIndex) -> FileContext:
    label = str(path)
    relative = path.relative_to(root).parts
    owner = nccl_file_owner(label)
    if relative[0] == "nccl" and owner is not None:
        return FileContext(label=label, rank=hello.by_pid.get(owner))
    host = relative[1] if len(relative) > 2 else None
    # a job over nodes: each agent's logs below logs/<host>/node-<N>/, where two agents may
    # share a host and number their local ranks alike
    source = classify_log_path(relative)
    node = source.node if source is not None else None

    def local_to_global(local: int) -> int | None:
        if node is not None:
            found = hello.by_node_local.get((host, node, local))
            if found is not None:
                return found
            if hello.nodes_on(host) > 1:
                return None  # no hello of this node says: unknown, never another node's rank
        return hello.by_local.get((host, local), hello.single_host.get(local, local))

    local = local_rank_from_path(label)
    rank = local_to_global(local) if local is not None else None
    return FileContext(label=label, rank=rank, local_to_global=local_to_global)


class _HelloIndex:
    """Global ranks by (host, local rank), by (host, node, local rank) and by (host, pid), from
    the ranks' hello events (the node: the record of the rank's parent torchrun, else its
    GROUP_RANK, as protocol.node_records.node_of finds it)."""

    def __init__(self, records: dict[int, NodeRecord] | None = None) -> None:
        # (host, its torchrun's pid) -> node, once: a hello per rank looks it up
        self.agents: dict[tuple[object, object], int] = {
            (r.host, r.torchrun_pid): n
            for n, r in sorted((records or {}).items(), reverse=True)
            if r.torchrun_pid is not None
        }
        self.by_local: dict[tuple[str | None, int], int] = {}
        self.by_node_local: dict[tuple[str | None, int, int], int] = {}
        self.by_pid: dict[tuple[str, int], int] = {}
        self.hosts: set[str | None] = set()
        self._nodes_of_host: dict[str | None, set[int]] = {}

    def add(self, event: dict) -> None:
        rank, host, local, pid = (event.get(k) for k in ("rank", "host", "local_rank", "pid"))
        self.hosts.add(host)
        if not isinstance(rank, int):
            return
        if isinstance(local, int):
            self.by_local.setdefault((host, local), rank)
            node = self.agents.get((host, event.get("ppid")), event.get("group_rank"))
            if isinstance(node, int) and not isinstance(node, bool):
                self.by_node_local.setdefault((host, node, local), rank)
                self._nodes_of_host.setdefault(host, set()).add(node)
        if isinstance(pid, int) and isinstance(host, str):
            self.by_pid[(host, pid)] = rank

    def nodes_on(self, host: str | None) -> int:
        """How many nodes' agents ran on `host`, as the hellos say."""
        return len(self._nodes_of_host.get(host, ()))

    @property
    def single_host(self) -> dict[int, int]:
        """On one host, a log folder named unlike the hello host still maps by local rank."""
        if len(self.hosts) != 1:
            return {}
        return {local: rank for (_, local), rank in self.by_local.items()}


def _hello_index(events_dir: Path, records: dict[int, NodeRecord] | None = None) -> _HelloIndex:
    index = _HelloIndex(records)
    for path in sorted(events_dir.glob("rank-*.jsonl")) if events_dir.is_dir() else []:
        try:
            with bounded.open_regular(path, buffered=True) as stream:
                for _, raw in zip(range(_HELLO_SCAN_LINES), stream, strict=False):
                    event = parse_event_line(raw)
                    if event is not None and event.get("kind") == "hello":
                        index.add(event)
                        break
        except OSError:
            continue
    return index
