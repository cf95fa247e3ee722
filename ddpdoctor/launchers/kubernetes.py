"""A Kubernetes pod's view of the launch: torchrun's PET_* variables and the pod's own markers.

torchrun reads each of its options from a `PET_<OPTION>` variable when the option is not given
on its command line (PET_NNODES for --nnodes, PET_NPROC_PER_NODE, PET_NODE_RANK,
PET_MASTER_ADDR, PET_MASTER_PORT, PET_RDZV_ENDPOINT, ...). Kubeflow's PyTorchJob and its Trainer
set exactly those in every pod, so in a pod they are the launch configuration: before torchrun
starts (an init container, a preflight in the entrypoint) they say how many nodes, which node
this pod is, and where the master is. Every pod has KUBERNETES_SERVICE_HOST.

With no RANK / WORLD_SIZE set, `doctor --distributed` run once per pod (an init container) is
rank PET_NODE_RANK of PET_NNODES, joined at PET_MASTER_ADDR:PET_MASTER_PORT (torch_env_from_pet).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ddpdoctor.launchers.variables import parse_int

PET_VARS = (
    "PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
    "PET_RDZV_ENDPOINT", "PET_RDZV_BACKEND", "PET_RDZV_ID", "PET_MAX_RESTARTS",
)  # fmt: skip
KUBERNETES_VARS = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")


@dataclass(frozen=True)
class PetConfig:
    """torchrun's launch as the PET_* variables give it (None: not given, or not a number)."""

    nnodes: int | None  # the most nodes ("2", or "1:4" for an elastic range)
    nproc_per_node: int | None  # None too for "auto", "gpu", "cpu"
    node_rank: int | None
    master_addr: str | None  # PET_MASTER_ADDR, else the host of PET_RDZV_ENDPOINT
    master_port: int | None
    seen: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        parts = []
        if self.nnodes is not None:
            per = f" x {self.nproc_per_node} process{'es' if self.nproc_per_node != 1 else ''}"
            parts.append(f"{self.nnodes} node{'s' if self.nnodes != 1 else ''}")
            if self.nproc_per_node is not None:
                parts[-1] += per
        if self.node_rank is not None:
            parts.append(f"node rank {self.node_rank}")
        if self.master_addr:
            port = f":{self.master_port}" if self.master_port is not None else ""
            parts.append(f"master {self.master_addr}{port}")
        return ", ".join(parts) or "no launch settings"


def in_kubernetes(env: Mapping[str, str]) -> bool:
    return bool(env.get("KUBERNETES_SERVICE_HOST"))


def _nodes(text: str | None) -> int | None:
    if text is None:
        return None
    return parse_int(text.rpartition(":")[2]) if ":" in text else parse_int(text)


def pet_config(env: Mapping[str, str]) -> PetConfig | None:
    """None when no PET_* variable is set."""
    seen = {name: env[name] for name in PET_VARS if name in env}
    if not seen:
        return None
    addr = env.get("PET_MASTER_ADDR") or None
    port = parse_int(env.get("PET_MASTER_PORT"))
    endpoint = env.get("PET_RDZV_ENDPOINT")
    if endpoint and not addr:
        host, _, port_text = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
        addr = host.strip("[]") or None
        port = port if port is not None else parse_int(port_text)
    return PetConfig(
        nnodes=_nodes(env.get("PET_NNODES")),
        nproc_per_node=parse_int(env.get("PET_NPROC_PER_NODE")),
        node_rank=parse_int(env.get("PET_NODE_RANK")),
        master_addr=addr,
        master_port=port,
        seen=seen,
    )


def torch_env_from_pet(env: Mapping[str, str]) -> dict[str, str] | None:
    """One doctor per pod, before torchrun: RANK = PET_NODE_RANK, WORLD_SIZE = PET_NNODES,
    MASTER_ADDR / MASTER_PORT from PET_*; None when the PET_* variables do not say all of it."""
    config = pet_config(env)
    if config is None or config.nnodes is None or config.node_rank is None:
        return None
    out = {
        "RANK": str(config.node_rank),
        "WORLD_SIZE": str(config.nnodes),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(config.node_rank),
    }
    if config.master_addr:
        out["MASTER_ADDR"] = config.master_addr
    if config.master_port is not None:
        out["MASTER_PORT"] = str(config.master_port)
    return out
