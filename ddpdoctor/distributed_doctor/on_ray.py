"""`ddpdoctor doctor --distributed --ray [ADDRESS]`: the distributed doctor on every node of a
Ray cluster, one task per node, the same report as under srun.

Ray has no launcher command that starts one process per node, so this one is the launcher: it
joins the cluster as a driver (ADDRESS, else what `ray.init()` finds: RAY_ADDRESS, a cluster
started on this machine, or a local one it starts), pins one task to each alive node
(NodeAffinitySchedulingStrategy), and each task runs `ddpdoctor doctor --distributed` with
RANK = the node's index, MASTER_ADDR = node 0's address and a port free there, as Ray Train
sets them for its workers. Node 0 is the driver's node when it is in the cluster, else the head.

The tasks are Ray workers: they see the environment Ray's workers see on their node (what
`ray start` was given there), plus the driver's NCCL_* and GLOO_* variables, which go into the
job's runtime_env as a user passes them to a Ray Train job. An interface the user forces is
therefore judged where the training workers will use it. Rank 0's report is printed here; the
other ranks' error lines go to stderr; the exit code is rank 0's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddpdoctor.console import sanitize
from ddpdoctor.errors import DdpdoctorError, UsageError
from ddpdoctor.exit_codes import ExitCode

LAUNCHED_BY_VAR = "DDPDOCTOR_LAUNCHED_BY"  # "ray": the report names Ray as the launcher
FORWARDED_PREFIXES = ("NCCL_", "GLOO_")
START_SLACK_S = 60.0  # a task's start and torch's import, on top of --timeout
LINE_WAIT_S = 30.0  # the most a node's task waits for the others' to start
CONNECT_SLACK_S = 60.0  # joining the cluster (or starting a local one), on top of --timeout
OUTPUT_CAP = 1 << 20  # bytes of a rank's stdout or stderr kept


class RayClusterError(DdpdoctorError):
    """The cluster cannot be joined or a node's task cannot run: problems found, exit 1."""

    exit_code = ExitCode.PROBLEMS


@dataclass(frozen=True)
class RayNode:
    node_id: str
    address: str  # the node's IP as Ray knows it (NodeManagerAddress)
    host: str
    gpus: float


def cluster_nodes(listing: Sequence[Mapping[str, Any]], first: str | None) -> list[RayNode]:
    """The alive nodes of `ray.nodes()`, node `first` (the driver's) first, else the head, then
    the others by address."""
    nodes = []
    head = None
    for entry in listing:
        if not entry.get("Alive"):
            continue
        resources = entry.get("Resources") or {}
        node = RayNode(
            node_id=str(entry.get("NodeID")),
            address=str(entry.get("NodeManagerAddress")),
            host=str(entry.get("NodeManagerHostname") or entry.get("NodeManagerAddress")),
            gpus=float(resources.get("GPU", 0) or 0),
        )
        if "node:__internal_head__" in resources:
            head = node.node_id
        nodes.append(node)
    lead = first if any(n.node_id == first for n in nodes) else head

    def order(node: RayNode) -> tuple[bool, tuple[int, ...] | str]:
        try:
            key: tuple[int, ...] | str = tuple(int(p) for p in node.address.split("."))
        except ValueError:
            key = node.address
        return (node.node_id != lead, key)

    return sorted(nodes, key=order)


def doctor_argv(args: argparse.Namespace, *, rank0: bool) -> list[str]:
    """`ddpdoctor ...` as each node runs it: this command's flags (files only to rank 0's, which
    runs on this node)."""
    debug = ["--debug"] if getattr(args, "debug", False) or "--debug" in sys.argv else []
    argv = [*debug, "doctor", "--distributed", "--timeout", str(args.timeout)]
    argv += ["--backend", args.backend]
    for flag, on in (("--json", args.json), ("-v", args.verbose), ("--strict", args.strict)):
        if on:
            argv.append(flag)
    for flag, value in (("--nproc", args.nproc), ("--workers", args.workers)):
        if value is not None:
            argv += [flag, str(value)]
    if rank0:
        if args.junit_xml:
            argv += ["--junit-xml", os.path.abspath(args.junit_xml)]
        for script in getattr(args, "script", None) or ():
            argv += ["--script", os.path.abspath(script)]
    return [*argv, *(args.check_ids or [])]


def node_env(rank: int, nodes: Sequence[RayNode], port: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(len(nodes)),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "NODE_RANK": str(rank),
        "MASTER_ADDR": nodes[0].address,
        "MASTER_PORT": str(port),
        LAUNCHED_BY_VAR: "ray",
    }


def free_port() -> int:
    """A port free on this node now (a Ray task on node 0), as Ray Train picks its MASTER_PORT."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class StartLine:
    """A Ray actor every node's task checks in with before it starts its doctor: Ray starts a
    worker for each task when it can, seconds apart on a busy cluster, and the doctor's clock
    (--timeout) must start on every node at about the same time."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.arrived = 0

    def arrive(self) -> None:
        self.arrived += 1

    def all_here(self) -> bool:
        return self.arrived >= self.expected


def doctor_here(
    argv: list[str], env: dict[str, str], timeout_s: float, line: Any = None
) -> dict[str, Any]:
    """A Ray task: `ddpdoctor ARGV` on this node (once every node's task has started, or after
    `timeout_s`), its output and exit code."""
    if line is not None:
        import time

        import ray

        with contextlib.suppress(Exception):
            deadline = time.monotonic() + LINE_WAIT_S
            ray.get(line.arrive.remote(), timeout=LINE_WAIT_S)
            while not ray.get(line.all_here.remote(), timeout=LINE_WAIT_S):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
    cmd = [sys.executable, "-m", "ddpdoctor", *argv]
    proc = subprocess.Popen(  # our own module, by the worker's own Python
        cmd,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        code = None
    return {
        "code": code,
        "host": socket.gethostname(),
        "stdout": out[:OUTPUT_CAP].decode("utf-8", "replace"),
        "stderr": err[:OUTPUT_CAP].decode("utf-8", "replace"),
    }


def main(args: argparse.Namespace) -> int:
    ray = _import_ray()
    address = args.ray or None
    wait_s = float(args.timeout) + START_SLACK_S
    done = threading.Event()
    _connect(ray, address, float(args.timeout) + CONNECT_SLACK_S, done)
    try:
        nodes = cluster_nodes(ray.nodes(), ray.get_runtime_context().get_node_id())
        if not nodes:
            raise RayClusterError(f"the Ray cluster at {address or 'auto'} has no alive node")

        def on(node: RayNode) -> dict[str, Any]:
            return {**_on_node(node), "num_cpus": 0, "num_gpus": node.gpus}

        port = _get(ray, ray.remote(free_port).options(**on(nodes[0])).remote(), wait_s, nodes[0])
        task = ray.remote(doctor_here)
        line = ray.remote(num_cpus=0)(StartLine).options(**_on_node(nodes[0])).remote(len(nodes))
        refs = [
            task.options(**on(node)).remote(
                doctor_argv(args, rank0=rank == 0), node_env(rank, nodes, port), wait_s, line
            )
            for rank, node in enumerate(nodes)
        ]
        results = [
            _get(ray, ref, wait_s + LINE_WAIT_S + 10, node)
            for ref, node in zip(refs, nodes, strict=True)
        ]
    finally:
        ray.shutdown()
        done.set()
    return _emit(results, nodes)


def _emit(results: list[dict[str, Any]], nodes: Sequence[RayNode]) -> int:
    for rank, (result, node) in enumerate(zip(results, nodes, strict=True)):
        for line in result["stderr"].splitlines():
            print(sanitize(line), file=sys.stderr)
        if result["code"] is None:
            print(
                f"ddpdoctor: error: rank {rank} on {_label(node)}: the doctor did not end in time",
                file=sys.stderr,
            )
    sys.stdout.write(results[0]["stdout"])
    sys.stdout.flush()
    code = results[0]["code"]
    return int(ExitCode.PROBLEMS) if code is None else int(code)


def _on_node(node: RayNode) -> dict[str, Any]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False)}


def _label(node: RayNode) -> str:
    return node.host if node.host == node.address else f"{node.host}, {node.address}"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError(
            "--ray needs Ray on this machine: pip install 'ray[default]' (the same version "
            "as the cluster's)"
        ) from None
    return ray


def _connect(ray: Any, address: str | None, wait_s: float, done: threading.Event) -> None:
    """ray.init() with a deadline: a cluster that never answers is one line, not a wait.

    The thread that called ray.init() lives until `done`: a local cluster's GCS and raylet are
    its children, started with the parent-death signal (SIGKILL), which the kernel sends when
    the thread that forked them ends, not the process."""
    import logging

    outcome: list[BaseException | None] = []
    answered = threading.Event()

    def connect() -> None:
        try:
            ray.init(
                address=address,
                logging_level=logging.ERROR,
                log_to_driver=False,
                runtime_env={"env_vars": forwarded_env(os.environ)},
            )
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported below as one line
            outcome.append(exc)
            return
        finally:
            answered.set()
        done.wait()

    thread = threading.Thread(target=connect, name="ddpdoctor-ray-init", daemon=True)
    thread.start()
    answered.wait(wait_s)
    where = address or os.environ.get("RAY_ADDRESS") or "this machine"
    if not outcome:
        raise RayClusterError(f"the Ray cluster at {where} did not answer within {wait_s:.0f} s")
    if outcome[0] is not None:
        first = str(outcome[0]).strip().splitlines()[:1]
        raise RayClusterError(
            f"cannot join the Ray cluster at {where}: {sanitize(first[0] if first else '')}"
        )


def forwarded_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(FORWARDED_PREFIXES)}


def _get(ray: Any, ref: Any, wait_s: float, node: RayNode) -> Any:
    try:
        return ray.get(ref, timeout=wait_s)
    except ray.exceptions.GetTimeoutError:
        raise RayClusterError(
            f"node {_label(node)}: its doctor task did not run within {wait_s:.0f} s"
        ) from None
    except ray.exceptions.RayError as exc:
        first = str(exc).strip().splitlines()[-1:] or [""]
        raise RayClusterError(
            f"node {_label(node)}: its doctor task failed ({type(exc).__name__}: "
            f"{sanitize(first[0])[:300]}); is ddpdoctor installed on that node?"
        ) from None
