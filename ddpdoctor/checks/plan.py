"""The planned job, as far as this process can tell: world size, ranks per node, nodes, master.

Several check groups need the same derived facts (is this a multi-node job? is this host the
master?), so they are worked out once here. Parsing is lenient: a malformed value becomes None and
the launcher checks report it; nothing here raises.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlparse

from ddpdoctor.launchers.kubernetes import pet_config
from ddpdoctor.launchers.variables import parse_int

DEFAULT_MASTER_PORT = 29500
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


@dataclass(frozen=True)
class Plan:
    init_method: str  # "env://" when not given
    scheme: str  # "env", "tcp", "file" or whatever was given (checked by rendezvous checks)
    backend: str  # "auto", "gloo" or "nccl" as asked; see resolved_backend()
    nproc_per_node: int | None  # ranks planned on this host
    nnodes: int | None
    world_size: int | None
    rank: int | None
    master_addr: str | None
    master_port: int | None
    master_port_text: str | None  # the raw text, for messages about bad values
    node_rank: int | None = None  # this host's node index, where the launch says (PET_NODE_RANK)

    @property
    def multi_node(self) -> bool:
        return (self.nnodes or 1) > 1

    def is_master_host(self, local_names: frozenset[str] = frozenset()) -> bool:
        """True when this host would run the TCPStore: rank 0, a loopback address or our own name."""
        if self.rank is not None:
            return self.rank == 0
        if self.node_rank is not None:
            return self.node_rank == 0
        addr = (self.master_addr or "").lower()
        if not addr or addr in LOOPBACK_NAMES or addr.startswith("127.") or addr == "::1":
            return True
        # No getfqdn(): it is a reverse DNS lookup without a time limit.
        host = socket.gethostname().lower()
        names = {host, host.split(".", 1)[0], *local_names}
        return addr in names or addr.split(".", 1)[0] == host

    def resolved_backend(self, gpus_visible: int) -> str:
        if self.backend in ("gloo", "nccl"):
            return self.backend
        return "nccl" if gpus_visible > 0 else "gloo"


def build_plan(
    env: Mapping[str, str],
    *,
    init_method: str | None = None,
    backend: str = "auto",
    nproc: int | None = None,
    nnodes: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> Plan:
    method = init_method or "env://"
    parsed = urlparse(method)
    scheme = parsed.scheme.lower()

    world = parse_int(env.get("WORLD_SIZE"))
    local_world = parse_int(env.get("LOCAL_WORLD_SIZE"))
    slurm_tasks_per_node = parse_int((env.get("SLURM_NTASKS_PER_NODE") or "").split("(")[0])
    # torchrun's PET_* variables (a Kubernetes pod before torchrun starts) come last
    pet = pet_config(env)
    per_node = nproc or local_world or slurm_tasks_per_node or (pet.nproc_per_node if pet else None)

    nodes = nnodes or parse_int(env.get("NNODES")) or parse_int(env.get("SLURM_NNODES"))
    nodes = nodes or parse_int(env.get("SLURM_JOB_NUM_NODES")) or (pet.nnodes if pet else None)
    if nodes is None and world and local_world and local_world > 0:
        nodes = max(1, world // local_world)

    addr, port_text = master_addr, str(master_port) if master_port is not None else None
    if scheme == "tcp":
        addr = addr or parsed.hostname
        port_text = port_text or (
            str(parsed.port) if _safe_port(parsed) else parsed.netloc.rsplit(":", 1)[-1]
        )
    addr = addr or env.get("MASTER_ADDR") or (pet.master_addr if pet else None)
    port_text = port_text or env.get("MASTER_PORT")
    if port_text is None and pet is not None and pet.master_port is not None:
        port_text = str(pet.master_port)

    return Plan(
        init_method=method,
        scheme=scheme,
        backend=backend,
        nproc_per_node=per_node,
        nnodes=nodes,
        world_size=world,
        rank=parse_int(env.get("RANK")),
        master_addr=addr,
        master_port=parse_int(port_text),
        master_port_text=port_text,
        node_rank=pet.node_rank if pet is not None else None,
    )


def _safe_port(parsed) -> bool:
    try:
        return parsed.port is not None
    except ValueError:  # "tcp://host:99999" raises on .port
        return False
