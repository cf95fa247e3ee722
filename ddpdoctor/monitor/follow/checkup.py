"""The preflight's script checkup findings, read from the run directory's doctor.json files.

`ddpdoctor run -- train.py` checks the script's source in its preflight and writes the report to
RUN_DIR/doctor.json (nodes/node-<N>/doctor.json for each node of a job that spans nodes). Its
script results (group "script") carry every finding in the Finding shape of DESIGN.md: a warning's
or error's in `facts.finding` (a rank-guard finding with `facts.block`, its guarded body's lines),
the info notes in `facts.findings` (a clean script's pass) or `facts.notes` (a script with
problems). The monitor keeps them as CheckupNotes so that a diagnosis
can cite the line that explains a symptom; the rules never read files themselves.

A report is written whole (atomically) and never rewritten, so each file is read once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ddpdoctor.monitor.model.snapshot import CheckupNote
from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.rundir import RunDir

SCRIPT_GROUP = "script"  # ddpdoctor.checks.scriptcheck.doctor.GROUP


def doctor_paths(run: RunDir) -> list[Path]:
    """The preflight reports present in the run directory now (one node's, or every node's)."""
    paths = [run.doctor_json] if run.doctor_json.is_file() else []
    return paths + sorted(run.nodes_dir.glob("node-*/doctor.json"))


def notes_of(report: Any) -> list[CheckupNote]:
    """The script checkup findings of one doctor report (doctor --json); [] for anything else."""
    results = report.get("results") if isinstance(report, Mapping) else None
    notes: list[CheckupNote] = []
    for result in results if isinstance(results, list) else ():
        if not isinstance(result, Mapping) or result.get("group") != SCRIPT_GROUP:
            continue
        facts = result.get("facts")
        if not isinstance(facts, Mapping):
            continue
        found = [_note(facts.get("finding"), facts.get("block"))]
        found += [_note(f) for f in (*_list(facts.get("findings")), *_list(facts.get("notes")))]
        notes.extend(note for note in found if note is not None)
    return notes


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _note(finding: Any, block: Any = None) -> CheckupNote | None:
    """A Finding-shaped dict ({"id", "summary", "evidence": [{file, line, text}]}) as a note;
    `block`: the result's facts.block, [first, last] line of the rank guard's body."""
    if not isinstance(finding, Mapping):
        return None
    evidence = _list(finding.get("evidence"))
    first = evidence[0] if evidence and isinstance(evidence[0], Mapping) else {}
    rule, path, line = finding.get("id"), first.get("file"), first.get("line")
    if not isinstance(rule, str) or not isinstance(path, str) or not path:
        return None
    if not isinstance(line, int) or isinstance(line, bool) or line <= 0:
        return None  # an unreadable script (line 0) has no line a symptom could be at
    return CheckupNote(
        rule=rule,
        path=path,
        line=line,
        summary=str(finding.get("summary") or ""),
        text=str(first.get("text") or ""),
        block=_span(block),
    )


def _span(value: Any) -> tuple[int, int] | None:
    if not isinstance(value, list) or len(value) != 2:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return (value[0], value[1]) if 0 < value[0] <= value[1] else None


class CheckupReader:
    """Reads each doctor.json of a run once, as it appears (a watcher may attach before the
    preflight has written it), and keeps the union of their script findings."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self._read: set[Path] = set()
        self.notes: tuple[CheckupNote, ...] = ()

    def refresh(self) -> tuple[CheckupNote, ...]:
        for path in doctor_paths(self.run):
            if path in self._read:
                continue
            try:
                report = jsontext.read(path)
            except FileNotFoundError:
                continue  # gone between the listing and the read: look again next time
            except (OSError, ValueError):
                report = None  # unreadable or not JSON: it will not get better
            self._read.add(path)
            self.notes = merged(self.notes, notes_of(report))
        return self.notes


def merged(old: Iterable[CheckupNote], new: Iterable[CheckupNote]) -> tuple[CheckupNote, ...]:
    """Both, each (rule, path, line) once, in file and line order (every node checks the same
    script, so a job over nodes reports each finding once)."""
    seen: dict[tuple[str, str, int], CheckupNote] = {}
    for note in (*old, *new):
        seen.setdefault((note.rule, note.path, note.line), note)
    return tuple(sorted(seen.values(), key=lambda n: (n.path, n.line, n.rule)))
