"""Stack captures asked through the run directory, for ranks a watcher cannot reach itself.

py-spy can only attach to a process on its own host, so a watcher that wants the stacks of ranks
on other nodes asks the launchers there, through the shared run directory:

    requests/<id>.json             {"schema_version", "id", "ranks": [...], "created_t",
                                    "deadline_t", "asked_by": {"host", "pid", "role", "node"}}
    requests/<id>.node<N>.done     node N's answer: {"request_id", "node", "host", "pid",
                                    "capture_id", "ranks": [captured], "errors": {rank: why},
                                    "answered_t"}
    stacks/<capture_id>/rank-<R>.json   the dumps themselves (ddpdoctor.stacks.capture)

Every file is written whole (temp file + rename), so a reader never sees half of one; names that
do not fit the pattern, dot files (temp files) and unreadable JSON are ignored. A launcher answers
a request once, for the wanted ranks it owns, while the deadline has not passed. Requests and
answers stay as the record of what was asked (a post-mortem shows them) until RETAIN_S after their
deadline, when whoever scans the folder next removes them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor.protocol import jsontext
from ddpdoctor.protocol.jsontext import is_int, is_number
from ddpdoctor.protocol.rundir import RunDir, write_json_atomic

SCHEMA_VERSION = 1
DEFAULT_TIMEOUT_S = 20.0  # launchers poll every second; py-spy needs a few seconds under load
RETAIN_S = 3600.0  # answered or expired requests stay this long as the record, then go
REQUEST_SUFFIX = ".json"
ANSWER_SUFFIX = ".done"
# No dots in an id: "<id>.json" and "<id>.node<N>.done" split without ambiguity.
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,160}$")
_ANSWER = re.compile(r"^(?P<id>[A-Za-z0-9][A-Za-z0-9_-]{0,160})\.node(?P<node>\d+)\.done$")
_UNSAFE = re.compile(r"[^A-Za-z0-9-]+")
_counter = itertools.count(1)


@dataclass(frozen=True)
class Asker:
    """Who asked: a launcher (with its node rank) or a `ddpdoctor watch`."""

    host: str
    pid: int
    role: str = "watch"  # "launcher" | "watch"
    node: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "role": self.role, "node": self.node}

    def describe(self) -> str:
        who = f"node {self.node}'s launcher" if self.node is not None else self.role
        return f"{who} (pid {self.pid} on {self.host})"

    @classmethod
    def here(cls, *, role: str = "watch", node: int | None = None) -> Asker:
        return cls(socket.gethostname(), os.getpid(), role, node)


@dataclass(frozen=True)
class StackRequest:
    id: str
    ranks: tuple[int, ...]
    created_t: float
    deadline_t: float
    asked_by: Asker

    def expired(self, now: float) -> bool:
        return now >= self.deadline_t

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "id": self.id,
            "ranks": list(self.ranks),
            "created_t": self.created_t,
            "deadline_t": self.deadline_t,
            "asked_by": self.asked_by.to_json(),
        }

    @classmethod
    def from_json(cls, data: Any) -> StackRequest:
        """A request from its JSON; ValueError for anything that is not one."""
        if not isinstance(data, Mapping) or data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError("not a stack request")
        ident, ranks, asked = data.get("id"), data.get("ranks"), data.get("asked_by")
        if not isinstance(ident, str) or not _ID.match(ident):
            raise ValueError("bad request id")
        if not isinstance(ranks, list) or not all(is_int(r) and r >= 0 for r in ranks):
            raise ValueError("bad ranks")
        created, deadline = data.get("created_t"), data.get("deadline_t")
        if not is_number(created) or not is_number(deadline):
            raise ValueError("bad times")
        asked = asked if isinstance(asked, Mapping) else {}
        node = asked.get("node")
        return cls(
            id=ident,
            ranks=tuple(sorted(set(ranks))),
            created_t=float(created),
            deadline_t=float(deadline),
            asked_by=Asker(
                host=str(asked.get("host") or "?"),
                pid=int(asked["pid"]) if is_int(asked.get("pid")) else 0,
                role=str(asked.get("role") or "watch"),
                node=node if is_int(node) else None,
            ),
        )


@dataclass(frozen=True)
class StackAnswer:
    """One node's answer to a request: which wanted ranks it captured, where, and what failed."""

    request_id: str
    node: int
    host: str
    pid: int  # the answering launcher
    capture_id: str | None  # RUN_DIR/stacks/<capture_id>; None when nothing could be captured
    ranks: tuple[int, ...] = ()  # captured (a dump is stored for each)
    errors: tuple[tuple[int, str], ...] = field(default=())  # (rank, why there is no dump)
    answered_t: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "request_id": self.request_id,
            "node": self.node,
            "host": self.host,
            "pid": self.pid,
            "capture_id": self.capture_id,
            "ranks": list(self.ranks),
            "errors": {str(rank): why for rank, why in self.errors},
            "answered_t": self.answered_t,
        }

    @classmethod
    def from_json(cls, data: Any) -> StackAnswer:
        if not isinstance(data, Mapping) or data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError("not a stack answer")
        ident, node, capture = data.get("request_id"), data.get("node"), data.get("capture_id")
        if not isinstance(ident, str) or not _ID.match(ident) or not is_int(node):
            raise ValueError("bad answer")
        if capture is not None and (not isinstance(capture, str) or "/" in capture):
            raise ValueError("bad capture id")
        ranks = data.get("ranks") or []
        errors = data.get("errors") or {}
        if not isinstance(ranks, list) or not isinstance(errors, Mapping):
            raise ValueError("bad answer ranks")
        answered = data.get("answered_t")
        return cls(
            request_id=ident,
            node=int(node),
            host=str(data.get("host") or "?"),
            pid=int(data["pid"]) if is_int(data.get("pid")) else 0,
            capture_id=capture,
            ranks=tuple(sorted(r for r in ranks if is_int(r))),
            errors=tuple(sorted((int(k), str(v)) for k, v in errors.items() if str(k).isdigit())),
            answered_t=float(answered) if is_number(answered) else 0.0,
        )


def new_request_id(asker: Asker, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    host = _UNSAFE.sub("-", asker.host).strip("-")[:40] or "host"
    return f"{stamp}-{host}-{asker.pid}-{next(_counter)}"


def request_path(run: RunDir, request_id: str) -> Path:
    return run.requests_dir / f"{request_id}{REQUEST_SUFFIX}"


def answer_path(run: RunDir, request_id: str, node: int) -> Path:
    return run.requests_dir / f"{request_id}.node{node}{ANSWER_SUFFIX}"


def write_request(
    run: RunDir,
    ranks: Iterable[int],
    *,
    asked_by: Asker,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    now: float | None = None,
) -> StackRequest:
    """Ask every launcher for the stacks of `ranks` (each answers for its own) until the deadline."""
    created = time.time() if now is None else now
    request = StackRequest(
        id=new_request_id(asked_by, created),
        ranks=tuple(sorted(set(ranks))),
        created_t=created,
        deadline_t=created + timeout_s,
        asked_by=asked_by,
    )
    write_json_atomic(request_path(run, request.id), request.to_json())
    return request


def _entries(run: RunDir) -> list[str]:
    """File names in requests/ (one directory listing: what launchers do every second)."""
    try:
        with os.scandir(run.requests_dir) as it:
            return [e.name for e in it if not e.name.startswith(".")]
    except OSError:
        return []


def _read_json(path: Path) -> Any:
    with contextlib.suppress(OSError, ValueError):
        return jsontext.read(path)
    return None


def scan_requests(
    run: RunDir, *, now: float | None = None, include_expired: bool = False
) -> list[StackRequest]:
    """Requests in the run directory, oldest first; torn, foreign and (unless asked) expired
    ones left out."""
    moment = time.time() if now is None else now
    found = []
    for name in _entries(run):
        if not name.endswith(REQUEST_SUFFIX) or not _ID.match(name[: -len(REQUEST_SUFFIX)]):
            continue
        try:
            request = StackRequest.from_json(_read_json(run.requests_dir / name))
        except ValueError:
            continue
        if request.id != name[: -len(REQUEST_SUFFIX)]:
            continue  # a copied or renamed file: its answers would not be found
        if include_expired or not request.expired(moment):
            found.append(request)
    return sorted(found, key=lambda r: (r.created_t, r.id))


def write_answer(run: RunDir, answer: StackAnswer) -> Path:
    path = answer_path(run, answer.request_id, answer.node)
    write_json_atomic(path, answer.to_json())
    return path


def answered_by(run: RunDir, request_id: str, node: int) -> bool:
    return answer_path(run, request_id, node).is_file()


def read_answers(run: RunDir, request_id: str) -> dict[int, StackAnswer]:
    """The answers to one request so far, by node (unreadable ones left out)."""
    answers: dict[int, StackAnswer] = {}
    for name in _entries(run):
        match = _ANSWER.match(name)
        if match is None or match.group("id") != request_id:
            continue
        try:
            answer = StackAnswer.from_json(_read_json(run.requests_dir / name))
        except ValueError:
            continue
        if answer.request_id == request_id and answer.node == int(match.group("node")):
            answers[answer.node] = answer
    return answers


def prune(run: RunDir, *, now: float | None = None, retain_s: float = RETAIN_S) -> int:
    """Remove requests whose deadline passed more than `retain_s` ago, with their answers, and
    answers whose request is gone. Returns how many files went."""
    moment = time.time() if now is None else now
    names = _entries(run)
    live_ids = set()
    removed = 0
    for request in scan_requests(run, now=moment, include_expired=True):
        if moment - request.deadline_t > retain_s:
            removed += _unlink(request_path(run, request.id))
        else:
            live_ids.add(request.id)
    for name in names:
        match = _ANSWER.match(name)
        if match is not None and match.group("id") not in live_ids:
            removed += _unlink(run.requests_dir / name)
    return removed


def _unlink(path: Path) -> int:
    try:
        path.unlink()
    except OSError:
        return 0
    return 1
