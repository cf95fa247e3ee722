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
    try:
        return pet_launch(env)
    except PetEnvError:
        return None


class PetEnvError(ValueError):
    """A PET_* value torchrun would refuse or misread; the message names that variable."""


# torchrun's defaults for the options PET_* may leave out (torch.distributed.run)
TORCHRUN_MASTER_ADDR = "127.0.0.1"
TORCHRUN_MASTER_PORT = 29500
C10D_PORT = 29400  # the c10d rendezvous backend's port when --rdzv-endpoint names none


def wants_pet_launch(env: Mapping[str, str]) -> bool:
    """The pod says which node it is (PET_NNODES or PET_NODE_RANK): one doctor rank per pod."""
    return "PET_NNODES" in env or "PET_NODE_RANK" in env


def pet_launch(env: Mapping[str, str]) -> dict[str, str]:
    """RANK, WORLD_SIZE, MASTER_ADDR... of a pod's doctor from PET_*, read as torchrun reads
    them (its defaults where one is not set); PetEnvError names the variable that is wrong."""
    nnodes = _pet_nnodes(env.get("PET_NNODES"))
    node_rank = _pet_node_rank(env.get("PET_NODE_RANK"), nnodes, "PET_NNODES" in env)
    addr, port = _pet_master(env, nnodes)
    return {
        "RANK": str(node_rank),
        "WORLD_SIZE": str(nnodes),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(node_rank),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
    }


def pet_master_vars(env: Mapping[str, str]) -> tuple[str, str]:
    """The variables the pod's master address and port come from, to name them in messages."""
    if env.get("PET_MASTER_ADDR") or not env.get("PET_RDZV_ENDPOINT"):
        return "PET_MASTER_ADDR", "PET_MASTER_PORT"
    port = "PET_MASTER_PORT" if "PET_MASTER_PORT" in env else "PET_RDZV_ENDPOINT"
    return "PET_RDZV_ENDPOINT", port


def _pet_nnodes(text: str | None) -> int:
    if text is None:
        return 1  # torchrun's --nnodes default, 1:1
    low, _, high = text.strip().partition(":")
    numbers = [parse_int(low), parse_int(high) if high else parse_int(low)]
    if None in numbers:
        raise PetEnvError(
            f"PET_NNODES={text!r} is not a number of nodes: torchrun takes N, or MIN:MAX for an "
            "elastic job (e.g. PET_NNODES=2)"
        )
    least, most = (int(n or 0) for n in numbers)
    if least < 1 or most < least:
        raise PetEnvError(
            f"PET_NNODES={text!r} names no usable number of nodes: N must be at least 1 "
            "(MIN:MAX with 1 <= MIN <= MAX)"
        )
    return most


def _pet_node_rank(text: str | None, nnodes: int, nnodes_set: bool) -> int:
    nodes = f"PET_NNODES={nnodes}" if nnodes_set else "PET_NNODES unset (torchrun's 1 node)"
    if text is None:
        if nnodes > 1:
            raise PetEnvError(
                f"PET_NODE_RANK is not set but {nodes}: each pod needs its own node rank, "
                f"0..{nnodes - 1} (torchrun's default 0 makes every pod node 0); set it from the "
                "replica index (the downward API's job-completion-index)"
            )
        return 0
    rank = parse_int(text)
    if rank is None:
        raise PetEnvError(f"PET_NODE_RANK={text!r} is not an integer: give each pod 0..N-1")
    if not 0 <= rank < nnodes:
        raise PetEnvError(
            f"PET_NODE_RANK={rank} is not below {nodes}: each pod's PET_NODE_RANK must be "
            f"0..{nnodes - 1}"
        )
    return rank


def _pet_master(env: Mapping[str, str], nnodes: int) -> tuple[str, int]:
    addr_text = env.get("PET_MASTER_ADDR")
    if addr_text is not None and not addr_text.strip():
        raise PetEnvError("PET_MASTER_ADDR is set but empty: give the master pod's name or IP")
    port_text = env.get("PET_MASTER_PORT")
    port = None if port_text is None else _port(port_text, "PET_MASTER_PORT")
    endpoint = env.get("PET_RDZV_ENDPOINT") or ""
    addr = addr_text.strip() if addr_text else None
    if endpoint and not addr:
        host, tail = _split_endpoint(endpoint.strip())
        if not host:
            raise PetEnvError(f"PET_RDZV_ENDPOINT={endpoint!r} names no host: use HOST:PORT")
        addr = host
        if port is None and tail is not None:
            port = _port(tail, "PET_RDZV_ENDPOINT", shown=endpoint)
        if port is None and (env.get("PET_RDZV_BACKEND") or "static") != "static":
            port = C10D_PORT
    if not addr:
        if nnodes > 1:
            raise PetEnvError(
                f"neither PET_MASTER_ADDR nor PET_RDZV_ENDPOINT is set but PET_NNODES={nnodes}: "
                f"torchrun would use {TORCHRUN_MASTER_ADDR} in every pod and the pods would not "
                "find each other; set PET_MASTER_ADDR to the master pod's service name"
            )
        addr = TORCHRUN_MASTER_ADDR
    return addr, TORCHRUN_MASTER_PORT if port is None else port


def _split_endpoint(endpoint: str) -> tuple[str, str | None]:
    """HOST:PORT, [V6]:PORT or HOST alone: (host, the port's text or None)."""
    if endpoint.startswith("["):
        host, _, rest = endpoint[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else None
    if ":" in endpoint:
        host, _, tail = endpoint.rpartition(":")
        return host, tail
    return endpoint, None


def _port(text: str, name: str, *, shown: str | None = None) -> int:
    port = parse_int(text)
    if port is None or not 0 < port < 65536:
        what = f"{name}={shown!r}: its port" if shown is not None else f"{name}={text!r}"
        raise PetEnvError(
            f"{what} is not a TCP port (1..65535); torchrun's default is {TORCHRUN_MASTER_PORT}"
        )
    return port
