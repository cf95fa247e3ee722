"""The Ray relay: each node's ranks reach the watcher through Ray itself, not a shared file system.

`ddpdoctor run -- COMMAND` with RAY_ADDRESS set (a job on a running Ray cluster) starts this next
to the job, as its own process (ddpdoctor/launch/ray_relay.py):
`python -m ddpdoctor.monitor.follow.ray_relay RUN_DIR ADDRESS`. It joins
the cluster as a Ray driver of its own and places one small actor on every other alive node
(NodeAffinitySchedulingStrategy; no CPU asked). Each actor folds its node's ranks' event files
where they are written (ddpdoctor.monitor.follow.node_fold: a node launcher's publisher, run
there) and, once a second, this process writes each node's summary into the run directory as
nodes/node-<N>/summary.json with its node record (nodes/node-<N>/node.json: the host, the
actor's pid as the node's watcher, the raylet's pid as the ranks' parent), which is how the
monitor's existing merge takes in other nodes' ranks.

The node the watcher runs on (this host) gets no actor: its ranks are read from their files as
ever. A node that joins later gets its actor at the next look (every 10 s). At its end (SIGTERM
from the launcher, or the launcher gone) each actor's ranks' files are brought into the run
directory whole where it does not have them (a node whose run directory is its own), so that
the final diagnosis and `ddpdoctor watch` afterwards read every event; then the node records
say the relay ended, and leaving the cluster ends its actors. Nothing here touches the job:
the relay is a separate Ray job whose failure leaves the watch to the files it can read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor.protocol.node_records import NodeRecord, write_node_record
from ddpdoctor.protocol.node_summary import write_summary_text
from ddpdoctor.protocol.rundir import RunDir, make_private_dirs, write_json_atomic

PUBLISH_EVERY_S = 1.0
NODES_EVERY_S = 10.0
CALL_TIMEOUT_S = 10.0
MAX_REQUESTS = 64  # stack requests, or files of one capture, passed at once
# What a node may send back into the run directory: its answer to a request, and its stacks.
_ANSWER_PATH = re.compile(
    r"^(requests/[A-Za-z0-9][A-Za-z0-9_-]{0,160}\.node\d{1,6}\.done"
    r"|stacks/[A-Za-z0-9][A-Za-z0-9_.-]{0,200}/[A-Za-z0-9][A-Za-z0-9_.-]{0,200}\.json)$"
)


class NodeActor:
    """On one node (as a Ray actor): its ranks' files folded, its summary, its files."""

    def __init__(self, run_dir: str, node_rank: int) -> None:
        from ddpdoctor.monitor.follow.node_fold import NodeFold

        # The run directory at the same path as the driver's: made here when this node has
        # its own, for the ranks to write into (a rank's writer never makes it: a run directory
        # removed under a job is not made again). The relay places its actors seconds after the
        # job starts; a Ray worker writes its first event once it joins a process group.
        with contextlib.suppress(OSError):
            os.makedirs(os.path.join(run_dir, "events"), mode=0o700, exist_ok=True)
        self.fold = NodeFold(run_dir, node_rank)
        self.responder: Any = None
        self.mirrored: dict[str, bool] = {}  # request id -> its answer shipped back

    def whoami(self) -> dict[str, Any]:
        return {"host": socket.gethostname(), "pid": os.getpid(), "ppid": os.getppid()}

    def summary(self) -> str:
        text = self.fold.summary()
        self._answer_stack_requests()
        return text

    def _answer_stack_requests(self) -> None:
        """Stacks of this node's ranks, asked in the run directory (seen here when it is
        shared): py-spy runs on their host, as a node's launcher does."""
        try:
            if self.responder is None:
                from ddpdoctor.stacks.responder import StackResponder

                self.responder = StackResponder(self.fold.run, self.fold.node_rank)
            mine = {
                rank: None if facts["gone"] or facts["ended"] else facts["pid"]
                for rank, facts in self.fold.ranks().items()
            }
            self.responder.poll(mine)
        except Exception:  # noqa: BLE001 - no stacks from here; the summary still goes
            pass

    def put_requests(self, requests: list[dict[str, Any]]) -> None:
        """Stack requests of the watcher's run directory, written into this node's copy where
        it has its own (a shared one has them already)."""
        from ddpdoctor.protocol.stack_requests import StackRequest, request_path

        for data in requests[:MAX_REQUESTS]:
            with contextlib.suppress(Exception):
                request = StackRequest.from_json(data)
                path = request_path(self.fold.run, request.id)
                if request.id not in self.mirrored and not path.exists():
                    write_json_atomic(path, data)
                    self.mirrored[request.id] = False

    def answers(self) -> list[tuple[str, Any]]:
        """This node's answers to mirrored requests, with their stacks, as (path in the run
        directory, JSON) pairs, once each."""
        from ddpdoctor.protocol import jsontext
        from ddpdoctor.protocol.stack_requests import answer_path

        run = self.fold.run
        out: list[tuple[str, Any]] = []
        for request_id, shipped in list(self.mirrored.items()):
            path = answer_path(run, request_id, self.fold.node_rank)
            if shipped or not path.is_file():
                continue
            with contextlib.suppress(Exception):
                answer = jsontext.read(path)
                capture = answer.get("capture_id") if isinstance(answer, dict) else None
                if isinstance(capture, str) and capture:
                    folder = run.stacks_dir / capture
                    for entry in sorted(os.listdir(folder))[:MAX_REQUESTS]:
                        if entry.endswith(".json") and (folder / entry).is_file():
                            out.append((f"stacks/{capture}/{entry}", jsontext.read(folder / entry)))
                out.append((str(path.relative_to(run.path)), answer))
                self.mirrored[request_id] = True
        return out

    def ranks(self) -> dict[int, dict[str, Any]]:
        self.fold.poll()
        return self.fold.ranks()

    def file_bytes(self, rank: int, start: int) -> bytes:
        return self.fold.file_bytes(rank, start)


@dataclass
class _Node:
    node_rank: int
    node_id: str
    actor: Any
    record: NodeRecord | None = None
    sent: set[str] = field(default_factory=set)  # stack requests passed on to it


class Relay:
    def __init__(self, ray: Any, run: RunDir) -> None:
        self.ray = ray
        self.run = run
        self.nodes: dict[str, _Node] = {}  # Ray node id -> its relay
        self.here = socket.gethostname()
        self.actor_class = ray.remote(num_cpus=0, max_restarts=0)(NodeActor)

    def place(self) -> None:
        """An actor on each alive node of another host that has none yet."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        for entry in self.ray.nodes():
            node_id = str(entry.get("NodeID"))
            if not entry.get("Alive") or node_id in self.nodes:
                continue
            if entry.get("NodeManagerHostname") == self.here:
                continue  # this host's ranks: read from their files
            rank = len(self.nodes) + 1
            strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
            actor = self.actor_class.options(scheduling_strategy=strategy).remote(
                str(self.run.path), rank
            )
            self.nodes[node_id] = _Node(rank, node_id, actor)

    def publish(self) -> None:
        for node in list(self.nodes.values()):
            try:
                if node.record is None:
                    who = self.ray.get(node.actor.whoami.remote(), timeout=CALL_TIMEOUT_S)
                    node.record = NodeRecord(
                        node_rank=node.node_rank,
                        host=str(who["host"]),
                        launcher_pid=int(who["pid"]),
                        torchrun_pid=int(who["ppid"]),  # the raylet: its workers' parent
                        started_t=time.time(),
                    )
                    write_node_record(self.run, node.record)
                text = self.ray.get(node.actor.summary.remote(), timeout=CALL_TIMEOUT_S)
                write_summary_text(self.run, node.node_rank, text)
                self._relay_stacks(node)
            except Exception as exc:  # noqa: BLE001 - a node lost: its summary stops, named stale
                _note(f"node {node.node_rank}: {type(exc).__name__}: {exc}")

    def _relay_stacks(self, node: _Node) -> None:
        """Stack requests to the node (where its run directory is its own), its answers back."""
        from ddpdoctor.protocol.stack_requests import scan_requests

        new = [r for r in scan_requests(self.run) if r.id not in node.sent]
        if new:
            node.sent.update(r.id for r in new)
            node.actor.put_requests.remote([r.to_json() for r in new])
        if not node.sent:
            return
        for rel, data in self.ray.get(node.actor.answers.remote(), timeout=CALL_TIMEOUT_S):
            parts = Path(rel).parts
            if not _ANSWER_PATH.match(rel) or ".." in parts:
                continue
            target = self.run.path / rel
            if not target.exists():
                if len(parts) == 3:
                    make_private_dirs(target.parent)
                write_json_atomic(target, data)

    def bring_home(self) -> None:
        """Each node's ranks' files, whole, where the run directory lacks them or has less."""
        for node in self.nodes.values():
            try:
                ranks = self.ray.get(node.actor.ranks.remote(), timeout=CALL_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - that node is gone: its summaries stand as they were
                continue
            for rank, facts in ranks.items():
                path = self.run.events_dir / f"rank-{rank}.jsonl"
                have = _size(path)
                if have is not None and have >= int(facts.get("bytes") or 0):
                    continue  # a shared run directory: the rank wrote it here
                with contextlib.suppress(Exception):
                    start = have or 0
                    data = self.ray.get(
                        node.actor.file_bytes.remote(rank, start), timeout=CALL_TIMEOUT_S
                    )
                    _append(path, data, start)

    def end(self) -> None:
        self.bring_home()
        now = time.time()
        for node in self.nodes.values():
            if node.record is not None:
                with contextlib.suppress(OSError):
                    write_node_record(self.run, node.record.with_(ended_t=now, exit_code=0))


def _size(path: Path) -> int | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_size if os.path.isfile(path) and not os.path.islink(path) else None


def _append(path: Path, data: bytes, start: int) -> None:
    """The file's bytes from `start` on: a new file (0600, never through a link) or its rest."""
    if not data:
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags if start else flags | os.O_EXCL, 0o600)
    try:
        os.pwrite(fd, data, start)
    finally:
        os.close(fd)


def _note(message: str) -> None:
    with contextlib.suppress(Exception):
        sys.stderr.write(f"ddpdoctor ray relay: {message}\n")


def main(argv: list[str]) -> int:
    run_dir, address = argv[0], argv[1]
    parent = os.getppid()
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides when the relay ends
    import ray

    ray.init(
        address=address,
        logging_level=logging.ERROR,
        log_to_driver=False,
        namespace="ddpdoctor-relay",
        runtime_env={"env_vars": {"DDPDOCTOR_RAY_RELAY_ACTOR": "1"}},
    )
    # (after ray.init, which installs a handler of its own that ends the process at once)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    relay = Relay(ray, RunDir(Path(run_dir)))
    try:
        looked = 0.0
        while not stop.is_set() and os.getppid() == parent:
            now = time.monotonic()
            if now - looked >= NODES_EVERY_S:
                looked = now
                relay.place()
            relay.publish()
            stop.wait(PUBLISH_EVERY_S)
        relay.end()
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
