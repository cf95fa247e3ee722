"""NCCL's transport switches (P2P, SHM, IB, GPUDirect RDMA) and the speed each one costs.

These switches are often set once as a workaround for a hang or an error and then forgotten; each
warning here says what the switch costs and why people usually set it.
"""

from __future__ import annotations

from ddpdoctor.checks.context import CheckContext
from ddpdoctor.checks.gpu_plan import visible_gpu_count
from ddpdoctor.checks.nccl_ifname import parse_ifname_list
from ddpdoctor.checks.probes.gpu import IbDevice
from ddpdoctor.checks.problems import Problem

TRANSPORT_SWITCHES = (
    "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_NET",
    "NCCL_IB_HCA", "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_IB_GID_INDEX",
    "NCCL_CROSS_NIC", "NCCL_NET_PLUGIN", "NCCL_NVLS_ENABLE", "NCCL_CUMEM_ENABLE",
    "NCCL_P2P_DIRECT_DISABLE",
)  # fmt: skip


def switch_on(value: str | None) -> bool:
    """NCCL reads these switches as integers: anything but 0 turns them on."""
    return value is not None and value.strip() not in ("", "0")


def transport_problems(
    ctx: CheckContext,
    switches: dict[str, str | None],
    active: list[IbDevice],
    hca_names: list[str],
) -> list[Problem]:
    """Warnings for switches that cost speed, given the values in effect and the active HCAs."""
    problems: list[Problem] = []
    gpus = visible_gpu_count(ctx)
    multi = ctx.plan.multi_node
    if switch_on(switches["NCCL_P2P_DISABLE"]) and gpus > 1:
        problems.append(
            Problem(
                "NCCL_P2P_DISABLE=1: traffic between this node's GPUs goes through host memory "
                "instead of NVLink/PCIe peer-to-peer, often several times slower. It is usually "
                "set to get past broken PCIe P2P (ACS/IOMMU hangs, F22) or 'peer access is not "
                "supported' (F23)",
                fix="unset NCCL_P2P_DISABLE once P2P works (disable ACS, boot with iommu=pt); "
                "to limit P2P instead of disabling it, use NCCL_P2P_LEVEL=NVL (or PIX)",
                fatal=False,
            )
        )
    if switch_on(switches["NCCL_SHM_DISABLE"]) and gpus > 1:
        problems.append(
            Problem(
                "NCCL_SHM_DISABLE=1: intra-node traffic that cannot use P2P goes through the "
                "network stack. It is usually set because /dev/shm is too small (Docker's 64 MB "
                "default, F24)",
                fix="enlarge /dev/shm (docker --shm-size=8g or --ipc=host) and unset "
                "NCCL_SHM_DISABLE",
                fatal=False,
            )
        )
    if multi and active:
        names = ", ".join(d.name for d in active)
        if (
            switch_on(switches["NCCL_IB_DISABLE"])
            or (switches["NCCL_NET"] or "").lower() == "socket"
        ):
            which = (
                "NCCL_IB_DISABLE=1" if switch_on(switches["NCCL_IB_DISABLE"]) else "NCCL_NET=Socket"
            )
            problems.append(
                Problem(
                    f"{which} with active InfiniBand/RoCE ({names}): traffic between nodes "
                    "falls back to TCP sockets, many times slower. It is usually set to get past "
                    "IB errors (completion error 12, wrong GID index: F27)",
                    fix="fix the fabric settings (NCCL_IB_GID_INDEX, NCCL_IB_HCA) and unset "
                    f"{which.split('=')[0]}",
                    fatal=False,
                )
            )
        gdr = (switches["NCCL_NET_GDR_LEVEL"] or "").strip().upper()
        if gdr in ("LOC", "0"):
            problems.append(
                Problem(
                    f"NCCL_NET_GDR_LEVEL={gdr} turns GPUDirect RDMA off: every transfer is "
                    "staged through host memory. It is usually set to get past IB error 4 with "
                    "ACS enabled (F27)",
                    fix="disable ACS on the PCIe switches and unset NCCL_NET_GDR_LEVEL",
                    fatal=False,
                )
            )
    hca = switches["NCCL_IB_HCA"]
    if hca and hca_names:
        spec = parse_ifname_list(hca)
        if not any(spec.matches(name) for name in hca_names):
            problems.append(
                Problem(
                    f"NCCL_IB_HCA={hca} matches none of this node's HCAs "
                    f"({', '.join(hca_names)}): NCCL falls back to TCP sockets",
                    fix=f"export NCCL_IB_HCA={','.join(hca_names)} (or a prefix such as mlx5)",
                    fatal=False,
                )
            )
    return problems
