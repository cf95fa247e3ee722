"""`ddpdoctor explain RUN_DIR`: whether the DDP replicas agreed at the end of the run.

Reads only the `replica_digest` events of each rank's file (runtime/replicas.py), folds them as the
live monitor does (model/replicas.py), and asks the replicas rule how the run ended: the digests
taken as the training ended (at `destroy_process_group`, or at a clean exit with the model still
alive), else the last step every rank digested. Each file is read regular-only and bounded.
"""

from __future__ import annotations

import re
from pathlib import Path

from ddpdoctor.findings import Finding
from ddpdoctor.monitor.judge.rules import replicas as rule
from ddpdoctor.monitor.model.replicas import ReplicaTrack
from ddpdoctor.protocol import bounded
from ddpdoctor.protocol.events import MAX_RANKS, REPLICA_DIGEST, parse_event_line

MAX_EVENTS_BYTES = 1 << 30  # of one rank's file, read at most
_RANK_FILE = re.compile(r"rank-([0-9]+)\.jsonl")
_MARK = b'"kind":"' + REPLICA_DIGEST.encode() + b'"'


def has_events(root: Path) -> bool:
    return (root / "events").is_dir()


def rank_digests(root: Path) -> rule.Ranks:
    """Each rank's digests, read from RUN_DIR/events/rank-<R>.jsonl."""
    out = []
    events = root / "events"
    for path in sorted(events.glob("rank-*.jsonl")):
        match = _RANK_FILE.fullmatch(path.name)
        if match is None or int(match.group(1)) >= MAX_RANKS or not bounded.is_regular(path):
            continue
        track = ReplicaTrack()
        try:
            with bounded.open_regular(path, root=root, buffered=True) as fh:
                read = 0
                for line in fh:
                    read += len(line)
                    if read > MAX_EVENTS_BYTES:
                        break
                    if _MARK not in line:
                        continue
                    event = parse_event_line(line)
                    if event is not None and event.get("kind") == REPLICA_DIGEST:
                        track.apply(event)
        except OSError:
            continue
        if track.view():
            out.append((int(match.group(1)), track.view()))
    return out


def findings(root: Path) -> list[Finding]:
    """Whether the replicas agreed at the end, and how they diverged if they did not; the infos
    about buffers not compared."""
    ranks = rank_digests(root)
    return rule.at_end(ranks) + rule.buffer_notes(ranks)
