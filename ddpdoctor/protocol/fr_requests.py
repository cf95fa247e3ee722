"""Flight-recorder dumps asked through the run directory: the monitor asks, every rank answers.

The recorder lives inside each rank's process, so only the rank can read it. A watcher asks by
writing a request; each rank's heartbeat thread notices it at its next beat (it looks at the
requests folder's modification time, one stat a beat) and answers with its dump:

    requests/fr-<id>.json          {"schema_version", "kind": "flight_recorder", "id",
                                    "created_t", "deadline_t", "ranks": null | [R, ...]}
    flight_recorder/rank-<R>.json  {"schema_version", "request_id", "rank", "taken_t",
                                    "dump": {...} | null, "error": null | "why not"}

A rank keeps one answer file, replaced by its next answer (the latest state is what matters).
Every file is written whole (temp file + rename); torn or foreign files are ignored. A request
shares the folder with the stack requests (ddpdoctor.protocol.stack_requests): its "kind" and its
"fr-" name keep the two apart, and that module's readers skip it (it has no stack "ranks" list).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.jsontext import is_number
from ddpdoctor.protocol.rundir import RunDir, write_json_atomic

SCHEMA_VERSION = 1
KIND = "flight_recorder"
PREFIX = "fr-"
ANSWERS_DIR = "flight_recorder"
KEEP_REQUESTS = 8  # expired requests kept as the record (the rest are pruned)
DEFAULT_TIMEOUT_S = 10.0  # ranks beat once a second; a request older than this is stale
_NAME = re.compile(r"^fr-[A-Za-z0-9_-]{1,120}\.json$")
_ANSWER = re.compile(r"^rank-(\d+)\.json$")
_counter = itertools.count(1)


@dataclass(frozen=True)
class FrRequest:
    id: str
    created_t: float
    deadline_t: float
    ranks: tuple[int, ...] | None = None  # None: every rank

    def wants(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": KIND,
            "id": self.id,
            "created_t": self.created_t,
            "deadline_t": self.deadline_t,
            "fr_ranks": list(self.ranks) if self.ranks is not None else None,
        }

    @classmethod
    def from_json(cls, data: Any) -> FrRequest:
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise ValueError("not a flight recorder request")
        ident, created, deadline = data.get("id"), data.get("created_t"), data.get("deadline_t")
        if not isinstance(ident, str) or not _NAME.match(ident + ".json"):
            raise ValueError("bad request id")
        if not all(
            isinstance(t, int | float) and not isinstance(t, bool) for t in (created, deadline)
        ):
            raise ValueError("bad times")
        ranks = data.get("fr_ranks")
        if ranks is not None and not (
            isinstance(ranks, list) and all(isinstance(r, int) and r >= 0 for r in ranks)
        ):
            raise ValueError("bad ranks")
        if not is_number(created) or not is_number(deadline):
            raise ValueError("bad times")
        return cls(
            ident, float(created), float(deadline), tuple(ranks) if ranks is not None else None
        )


@dataclass(frozen=True)
class FrAnswer:
    request_id: str
    rank: int
    taken_t: float
    dump: dict[str, Any] | None
    error: str | None = None
    step: int | None = None  # the rank's completed training steps when it took the dump

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "request_id": self.request_id,
            "rank": self.rank,
            "taken_t": self.taken_t,
            "dump": self.dump,
            "error": self.error,
            "step": self.step,
        }

    @classmethod
    def from_json(cls, data: Any) -> FrAnswer:
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError("not a flight recorder answer")
        rank, taken, ident = data.get("rank"), data.get("taken_t"), data.get("request_id")
        dump, error = data.get("dump"), data.get("error")
        if not isinstance(rank, int) or rank < 0 or not isinstance(ident, str):
            raise ValueError("bad answer")
        if not isinstance(taken, int | float) or isinstance(taken, bool):
            raise ValueError("bad time")
        if not (dump is None or isinstance(dump, dict)) or not (
            error is None or isinstance(error, str)
        ):
            raise ValueError("bad dump")
        step = data.get("step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else None
        return cls(ident, rank, float(taken), dump, error, step)


def answers_dir(run: RunDir) -> Path:
    return run.path / ANSWERS_DIR


def answer_path(run: RunDir, rank: int) -> Path:
    return answers_dir(run) / f"rank-{rank}.json"


def request_path(run: RunDir, request_id: str) -> Path:
    return run.requests_dir / f"{request_id}.json"


def write_request(
    run: RunDir,
    *,
    ranks: tuple[int, ...] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    now: float | None = None,
) -> FrRequest:
    moment = time.time() if now is None else now
    ident = f"{PREFIX}{int(moment * 1000)}-{os.getpid()}-{next(_counter)}"
    request = FrRequest(ident, moment, moment + timeout_s, ranks)
    write_json_atomic(request_path(run, ident), request.to_json())
    prune(run, now=moment)
    return request


def prune(run: RunDir, *, now: float, keep: int = KEEP_REQUESTS) -> int:
    """Remove expired requests beyond the latest `keep` (a long suspicion asks every few
    seconds; the latest ones stay as the record of what was asked). Returns how many went."""
    try:
        with os.scandir(run.requests_dir) as it:
            names = [e.name for e in it if _NAME.match(e.name)]
    except OSError:
        return 0
    requests = []
    for name in names:
        with contextlib.suppress(ValueError):
            requests.append((FrRequest.from_json(_read_json(run.requests_dir / name)), name))
    requests.sort(key=lambda pair: pair[0].created_t)
    removed = 0
    for request, name in requests[:-keep] if keep else requests:
        if request.deadline_t <= now:
            with contextlib.suppress(OSError):
                (run.requests_dir / name).unlink()
                removed += 1
    return removed


def _read_json(path: Path) -> Any:
    with contextlib.suppress(OSError, ValueError):
        return jsontext.read(path)
    return None


def scan_requests(run: RunDir, *, now: float | None = None) -> list[FrRequest]:
    """Unexpired flight-recorder requests, oldest first."""
    moment = time.time() if now is None else now
    try:
        with os.scandir(run.requests_dir) as it:
            names = [e.name for e in it if _NAME.match(e.name)]
    except OSError:
        return []
    found = []
    for name in names:
        try:
            request = FrRequest.from_json(_read_json(run.requests_dir / name))
        except ValueError:
            continue
        if request.id == name[: -len(".json")] and moment < request.deadline_t:
            found.append(request)
    return sorted(found, key=lambda r: (r.created_t, r.id))


def write_answer(run: RunDir, answer: FrAnswer) -> Path:
    path = answer_path(run, answer.rank)
    write_json_atomic(path, answer.to_json())
    return path


def read_answers(run: RunDir) -> dict[int, FrAnswer]:
    """Every rank's latest answer, by rank (torn or foreign files left out)."""
    try:
        with os.scandir(answers_dir(run)) as it:
            names = [e.name for e in it]
    except OSError:
        return {}
    answers = {}
    for name in names:
        match = _ANSWER.match(name)
        if match is None:
            continue
        try:
            answer = FrAnswer.from_json(_read_json(answers_dir(run) / name))
        except ValueError:
            continue
        if answer.rank == int(match.group(1)):
            answers[answer.rank] = answer
    return answers
