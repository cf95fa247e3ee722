"""Lines that look alarming but are normal: classified as info, never a finding.

Each one is a known false alarm (failure-modes.md §6): IPv6 missing, no InfiniBand, no NCCL net
plugin, the destroy_process_group reminder, torchrun's OMP_NUM_THREADS banner, the
torch.distributed.launch deprecation notice.
"""

from __future__ import annotations

from ddpdoctor.explain.log_rules import rule
from ddpdoctor.findings import Severity

RULES = (
    rule(
        "benign.ipv6_unavailable",
        Severity.INFO,
        r"errno: 97 - Address family not supported by protocol",
        ["errno: 97"],
        emits=False,
        examples=(
            "[W socket.cpp:464] [c10d] The server socket cannot be initialized on [::]:29500 "
            "(errno: 97 - Address family not supported by protocol).",
        ),
    ),
    rule(
        "benign.no_infiniband",
        Severity.INFO,
        r"Failed to open libibverbs\.so|NET/IB : No device found",
        ["libibverbs", "NET/IB : No device found"],
        emits=False,
        examples=(
            "misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]",
            "worker:101542:101542 [0] NCCL INFO NET/IB : No device found.",
        ),
    ),
    rule(
        "benign.no_net_plugin",
        Severity.INFO,
        r"NET/Plugin : No plugin found",
        ["No plugin found"],
        emits=False,
        examples=(
            "ArchLinux:6482:6482 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), "
            "using internal implementation",
        ),
    ),
    rule(
        "benign.destroy_process_group",
        Severity.INFO,
        r"destroy_process_group\(\) was not called before program exit",
        ["destroy_process_group() was not called"],
        emits=False,
        examples=(
            "Warning: WARNING: destroy_process_group() was not called before program exit, which "
            "can leak resources.",
        ),
    ),
    rule(
        "benign.omp_num_threads",
        Severity.INFO,
        r"Setting OMP_NUM_THREADS environment variable for each process|OMP_NUM_THREADS",
        ["OMP_NUM_THREADS"],
        emits=False,
        examples=(
            "W1122 04:11:30.000000 1 torch/distributed/run.py:803] Setting OMP_NUM_THREADS "
            "environment variable for each process to be 1 in default, to avoid your system being "
            "overloaded, please further tune the variable for optimal performance in your "
            "application as needed.",
        ),
    ),
    rule(
        "benign.launch_deprecated",
        Severity.INFO,
        r"The module torch\.distributed\.launch is deprecated",
        ["torch.distributed.launch is deprecated"],
        emits=False,
        examples=(
            "/site-packages/torch/distributed/launch.py:207: FutureWarning: The module "
            "torch.distributed.launch is deprecated",
        ),
    ),
)
