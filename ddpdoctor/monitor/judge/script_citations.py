"""The script checkup's word on a run-time finding: the line it flagged before the launch, cited.

`ddpdoctor run -- train.py` checks the script's source in its preflight (doctor.json; the monitor
carries the findings as Snapshot.checkup). When the run then shows the symptom a checkup rule
predicts (a hang at a collective under `if rank == 0:`, a set_epoch warning, a port in use), the
finding that states the symptom gets an Evidence line naming the flagged file:line (file and line
set on the Evidence) and a short clause on its summary. Citing changes no verdict, severity or
culprit, and a finding is cited once (its evidence already holds the citation: nothing added).

A hang or mismatch cites the rank-guard rule only where a rank is at the flagged line (its
heartbeat's innermost user frame, a py-spy stack): a rank in a collective at `train.py:42` when
the checkup flagged `train.py:42 dist.barrier()`, or anywhere in the `if rank == 0:` body that
holds the flagged call (a DDP forward flagged at one line, its backward's all-reduce waiting at
the next). A hang with no rank at any known line of a checked file (no heartbeat frames, no
stacks) cites the script's one rank-guard finding as what "may explain" it; with ranks seen
elsewhere in a checked file it cites nothing (doubt means silence).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import PurePath

from ddpdoctor.checks.scriptcheck.rules_collectives import RANK_GUARD
from ddpdoctor.checks.scriptcheck.rules_data import SET_EPOCH
from ddpdoctor.checks.scriptcheck.rules_devices import DEVICE, DEVICE_IDS
from ddpdoctor.checks.scriptcheck.rules_fsdp import FREEZE, GATHER, WRAP
from ddpdoctor.checks.scriptcheck.rules_setup import HARDCODED, PORT, TCP, UNUSED
from ddpdoctor.findings import Evidence, Finding
from ddpdoctor.monitor.model.snapshot import CheckupNote, Snapshot

TAG = "the script checkup"
# "file:line function", as heartbeats and py-spy labels write a frame (the path may hold spaces)
_FRAME = re.compile(r"^(?P<file>.*\S):(?P<line>\d+)(?:\s|$)")
MAX_CITED = 3  # notes cited on one finding (a rule may fire at many lines)


@dataclass(frozen=True)
class Cites:
    rules: tuple[str, ...]  # the checkup rules whose finding explains the symptom
    at_the_line: bool = False  # only where a rank is at the flagged line
    may_explain: bool = False  # ... else the script's one such finding, as "may explain"


# run-time finding id (the monitor's rules, the log explainers' ids) -> the checkup rules that
# predict its symptom. Log explainer ids also match a crash whose root rank logged them.
TABLE: dict[str, Cites] = {
    # ranks wait in a collective the others never reach: the collective (or DDP forward) that
    # only `if rank == 0:` runs; the line tells it apart from every other cause of a hang
    "hang": Cites((RANK_GUARD, GATHER), at_the_line=True, may_explain=True),
    # with the flight recorder (and on gloo) that rank-0-only call meets the other ranks' next
    # collective at the same sequence number: a mismatch, at the flagged line
    "mismatch": Cites((RANK_GUARD, GATHER), at_the_line=True),
    # the ranks' SPMD contracts differ: a fully_shard or a requires_grad_ under a rank guard
    "spmd.contract_mismatch": Cites((WRAP, FREEZE)),
    # the runtime's sampler audit sees what the source showed: no set_epoch(epoch) per epoch
    "sampler.set_epoch_missing": Cites((SET_EPOCH,)),
    # a port fixed in the code (MASTER_PORT, tcp://host:PORT) is taken by another job or by a
    # leftover of an earlier run: "Address already in use"
    "c10d.port_in_use": Cites((PORT, TCP)),
    # DDP's "Expected to have finished reduction": with find_unused_parameters=True set (the
    # checkup's note) it means a forward output did not feed the loss
    "ddp.unused_parameters": Cites((UNUSED,)),
    # DDP's run-time note that find_unused_parameters=True found nothing unused: the same line
    "ddp.find_unused_unneeded": Cites((UNUSED,)),
    # two ranks on one GPU: the device fixed to 0, or DDP's device_ids not the local rank
    "nccl.duplicate_gpu": Cites((DEVICE, DEVICE_IDS)),
    # ranks that disagree on the world size: a literal world_size/rank in init_process_group
    "init.world_size_mismatch": Cites((HARDCODED,)),
}


def annotate(findings: Sequence[Finding], snap: Snapshot) -> tuple[Finding, ...]:
    """The findings, with the checkup's findings cited on those whose symptom they explain."""
    if not snap.checkup:
        return tuple(findings)
    places: set[tuple[str, int]] | None = None  # where the ranks are, computed when first needed
    out = []
    for finding in findings:
        cites = _cites_for(finding, snap)
        if cites is None or any(e.text.startswith(TAG) for e in finding.evidence):
            out.append(finding)
            continue
        notes = [n for n in snap.checkup if n.rule in cites.rules]
        maybe = False
        if notes and cites.at_the_line:
            places = rank_places(snap) if places is None else places
            notes, maybe = _at_the_line(notes, places, cites, snap)
        out.append(cite(finding, notes[:MAX_CITED], maybe=maybe) if notes else finding)
    return tuple(out)


def _at_the_line(
    notes: list[CheckupNote], places: set[tuple[str, int]], cites: Cites, snap: Snapshot
) -> tuple[list[CheckupNote], bool]:
    """(the notes to cite, whether as "may explain"): those at a line where a rank is; else the
    script's one note of the rule when no rank was seen anywhere in a checked file."""
    at_line = [n for n in notes if any(n.covers(line) for line in _lines_in(n.path, places))]
    if at_line or not cites.may_explain or len(notes) != 1:
        return at_line, False
    checked = {_name(n.path) for n in snap.checkup}
    if any(name in checked for name, _ in places):
        return [], False  # ranks were seen in the checked files, none at the flagged line
    return notes, True


def _lines_in(path: str, places: set[tuple[str, int]]) -> list[int]:
    name = _name(path)
    return [line for file, line in places if file == name]


def _cites_for(finding: Finding, snap: Snapshot) -> Cites | None:
    """The table's entry for a finding; a crash (or a rank that died) takes the entries of what
    its ranks logged, as the log explainers recognised it."""
    if finding.id in TABLE:
        return TABLE[finding.id]
    if finding.id not in ("crash", "died"):
        return None
    rules: list[str] = []
    for rank in finding.ranks:
        view = snap.rank(rank)
        for log in view.error_lines if view is not None else ():
            entry = TABLE.get(log.finding_id or "")
            if entry is not None and not entry.at_the_line:
                rules.extend(r for r in entry.rules if r not in rules)
    return Cites(tuple(rules)) if rules else None


def cite(finding: Finding, notes: Sequence[CheckupNote], *, maybe: bool = False) -> Finding:
    """The finding with the notes as evidence (file and line set) and a clause on its summary."""
    lead = (
        f"{TAG} flagged a line before the launch that may explain this"
        if maybe
        else f"{TAG} flagged this before the launch"
    )
    evidence = tuple(Evidence(f"{lead}: {_describe(n)}", file=n.path, line=n.line) for n in notes)
    where = notes[0].location + (f" and {len(notes) - 1} more" if len(notes) > 1 else "")
    clause = (
        f"{where}, flagged by {TAG}, may explain it"
        if maybe
        else f"{TAG} flagged {where} before the launch"
    )
    return replace(
        finding, summary=f"{finding.summary} ({clause})", evidence=finding.evidence + evidence
    )


def _describe(note: CheckupNote) -> str:
    """ "`dist.barrier()` — barrier() runs only under ... [script.collective_...]": the file and
    line are the Evidence's own (the text view prints them in front, JSON has them as fields)."""
    code = f"`{note.text}` — " if note.text else ""
    return f"{code}{note.summary} [{note.rule}]"


def rank_places(snap: Snapshot) -> set[tuple[str, int]]:
    """(file name, line) of every place a rank is known to be: its heartbeat's innermost user
    frame and innermost frame, and the frames of the captured stacks."""
    places: set[tuple[str, int]] = set()
    for view in snap.ranks:
        if view.activity is not None:
            places.update(_parse(view.activity.where), _parse(view.activity.frame))
    for group in snap.stacks:
        for frame in (*group.frames, *group.full_frames):
            places.update(_parse(frame))
    return places


def _parse(frame: str | None) -> tuple[tuple[str, int], ...]:
    """ "job.py:15 <module>" -> (("job.py", 15),); a folded marker or a native frame -> ()."""
    match = _FRAME.match(frame or "")
    return ((_name(match["file"]), int(match["line"])),) if match else ()


def _name(path: str) -> str:
    """Frames name files by their base name (the heartbeat, py-spy's labels): compare on it."""
    return PurePath(path).name
