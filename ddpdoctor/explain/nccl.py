"""NCCL's own log lines (NCCL_DEBUG=WARN/INFO): one rule per known WARN; init facts in nccl_init."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddpdoctor.explain.lines import SourceLine
from ddpdoctor.explain.log_rules import Candidate, EvidenceList, Groups, LineRule, render, rule
from ddpdoctor.explain.nccl_init import IFNAME_FIX
from ddpdoctor.findings import Finding, Severity

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO

_IFNAME_FIX = IFNAME_FIX


def _ib_summary(groups: Groups) -> str:
    err = groups.get("err", "?")
    meaning = {
        "12": "error 12 is a timeout: the NICs cannot reach each other over RoCE/IB",
        "4": "error 4 is a protection error, usually ACS breaking GPUDirect RDMA",
        "5": "error 5 means the work request was flushed after an earlier failure",
    }.get(err, f"error {err}")
    return f"InfiniBand completion error from peer {groups.get('peer', '?')}: {meaning}"


def _ib_fix(groups: Groups) -> str:
    if groups.get("err") == "4":
        return (
            "Confirm with NCCL_NET_GDR_LEVEL=0; then disable ACS on the PCIe switches "
            "(or boot with iommu=pt)."
        )
    return (
        "For RoCE set NCCL_IB_GID_INDEX to the RoCE v2 GID (often 3: see "
        "/sys/class/infiniband/*/ports/*/gid_attrs/types); check `ibv_devinfo` shows every port "
        "ACTIVE and the same NCCL_IB_HCA on all nodes; NCCL_IB_DISABLE=1 falls back to sockets."
    )


def _ifname_set(groups: Groups) -> str:
    """How the log set NCCL_SOCKET_IFNAME before the failure, for a summary; "" when it did not."""
    ifname = groups.get("ifname")
    return f"NCCL_SOCKET_IFNAME={ifname} (set earlier in this log)" if ifname else ""


def _no_interface_summary(groups: Groups) -> str:
    summary = "NCCL found no network interface to bootstrap on"
    if groups.get("ifname"):
        return f"{summary}: {_ifname_set(groups)} matches no interface that is up with an address"
    return summary + " (it needs an IP interface even on one node)"


def _no_interface_fix(groups: Groups) -> str:
    ifname = groups.get("ifname")
    named = f"NCCL_SOCKET_IFNAME (now {ifname})" if ifname else "NCCL_SOCKET_IFNAME"
    return (
        f"{named} must name (or prefix-match) an interface that is up and has an IP address "
        "(`ip -br addr`); unset it to let NCCL choose, and never exclude every interface with `^`."
    )


def _bad_address_summary(groups: Groups) -> str:
    cause = _ifname_set(groups) or "NCCL_SOCKET_IFNAME"
    return (
        f"NCCL tried to connect to an invalid address (family {groups.get('family', '?')}): "
        f"{cause} matches no usable interface, or the nodes run different NCCL versions"
    )


def _bad_address_fix(groups: Groups) -> str:
    ifname = groups.get("ifname")
    named = f"NCCL_SOCKET_IFNAME (now {ifname})" if ifname else "NCCL_SOCKET_IFNAME"
    return (
        f"Point {named} at an interface that exists and is up on every node (`ip -br addr`), "
        "and use the same NCCL version everywhere."
    )


RULES = (
    rule(
        "nccl.stub_libcuda",
        ERROR,
        r"CUDA driver is a stub library",
        ["stub library"],
        "NCCL loaded the libcuda stub (a library for compiling only) instead of the driver's libcuda",
        "Remove the CUDA `stubs` directory from LD_LIBRARY_PATH and /etc/ld.so.conf.d so "
        "libcuda.so.1 resolves to the NVIDIA driver's (`ldconfig -p | grep libcuda`).",
        examples=(
            "ArchLinux:6482:6482 [0] misc/strongstream.cc:60 NCCL WARN Cuda failure "
            "'CUDA driver is a stub library'",
        ),
    ),
    rule(
        "nccl.no_socket_interface",
        ERROR,
        r"no socket interface found",
        ["no socket interface found"],
        _no_interface_summary,
        _no_interface_fix,
        emits=False,  # SocketIfnameAnalyzer: it names the NCCL_SOCKET_IFNAME the log set
        examples=("Bootstrap : no socket interface found",),
    ),
    rule(
        "nccl.connect_retry",
        WARNING,
        r"Call to connect returned (?P<reason>.+?), retrying",
        ["Call to connect returned"],
        "NCCL keeps retrying a connection to a peer ({reason}; {count} line(s))",
        "A firewall or the wrong interface: " + _IFNAME_FIX,
        examples=(
            "worker:101542:101934 [0] NCCL INFO Call to connect returned Connection timed out, "
            "retrying",
        ),
    ),
    rule(
        "nccl.connect_failed",
        ERROR,
        r"Connect to (?P<addr>\S+) failed : (?P<reason>.+)",
        ["Connect to "],
        "NCCL could not connect to {addr}: {reason}",
        "Check that this address belongs to a live rank of this job: a stale file:// rendezvous "
        "file (use a new, empty one per job), a firewall, or a docker/veth/link-local interface "
        "are the usual causes. " + _IFNAME_FIX,
        examples=(
            "tj1:941227:943077 [0] include/socket.h:390 NCCL WARN Connect to "
            "10.38.10.112<21724> failed : Connection refused",
        ),
    ),
    rule(
        "nccl.connect_failed",
        ERROR,
        r"socketPollConnect: connect to (?P<addr>\S+) returned (?P<reason>.+)",
        ["socketPollConnect"],
        "NCCL could not connect to {addr}: {reason}",
        _IFNAME_FIX,
        examples=(
            "socketPollConnect: connect to 169.254.20.10<52597> returned Connection refused",
        ),
    ),
    rule(
        "nccl.shm_exhausted",
        ERROR,
        r"(?:Error while creating shared memory segment (?P<seg>\S+)"
        r"|failed to extend (?P<seg2>/dev/shm/\S+) to \d+ bytes"
        r"|posix_fallocate failed : No space left on device)",
        ["shared memory segment", "failed to extend", "posix_fallocate"],
        lambda g: (
            "/dev/shm is full or too small: NCCL could not create its shared-memory segment"
            + (f" {g.get('seg') or g.get('seg2')}" if (g.get("seg") or g.get("seg2")) else "")
        ),
        "Give the container more shared memory (`docker run --shm-size=1g` or `--ipc=host`; on "
        "Kubernetes an emptyDir with medium: Memory on /dev/shm), delete stale /dev/shm/nccl-* "
        "segments of dead jobs, or set NCCL_SHM_DISABLE=1 (slower).",
        examples=(
            "host:1:2 [0] misc/shmutils.cc:132 NCCL WARN Error while creating shared memory "
            "segment /dev/shm/nccl-WU88OE (size 9637888), error: No space left on device (28)",
        ),
    ),
    rule(
        "nccl.duplicate_gpu",
        ERROR,
        r"Duplicate GPU detected : rank (?P<r1>\d+) and rank (?P<r2>\d+) both on CUDA device "
        r"(?P<dev>\w+)",
        ["Duplicate GPU detected"],
        "Two ranks use the same GPU (rank {r1} and rank {r2} on CUDA device {dev})",
        "Call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before any CUDA work (or pass "
        "device_id to init_process_group); check CUDA_VISIBLE_DEVICES per rank and that "
        "nproc_per_node is at most the number of GPUs.",
        rank_groups=("r1", "r2"),
        examples=(
            "smc:29880:30398 [0] init.cc:497 NCCL WARN Duplicate GPU detected : rank 2 and rank 0 "
            "both on CUDA device 1000",
        ),
    ),
    rule(
        "nccl.device_unknown",
        WARNING,
        r"(?:Rank (?P<rank>\d+)\]\s+)?using GPU (?P<gpu>\d+) as device used by this process is "
        r"currently unknown",
        ["is currently unknown"],
        "torch had to guess this rank's GPU (it picked GPU {gpu}): a wrong guess hangs or puts "
        "two ranks on one GPU",
        "Call torch.cuda.set_device(local_rank) before init_process_group, or pass "
        "device_id=torch.device('cuda', local_rank) to init_process_group.",
        rank_groups=("rank",),
        examples=(
            "[rank6]:[W319 12:03:46.604992123 ProcessGroupNCCL.cpp:4721] [PG ID 0 PG GUID 0 Rank 6]"
            "  using GPU 6 as device used by this process is currently unknown.",
        ),
    ),
    rule(
        "nccl.ib_completion_error",
        ERROR,
        r"NET/IB : Got completion from peer (?P<peer>\S+) with error (?P<err>\d+)",
        ["Got completion from peer"],
        _ib_summary,
        _ib_fix,
        examples=(
            "transport/net_ib.cc:881 NCCL WARN NET/IB : Got completion from peer "
            "172.17.127.143<49577> with error 12, opcode 1, len 0, vendor err 129",
        ),
    ),
    rule(
        "nccl.ib_async_event",
        ERROR,
        r"NET/IB : Got async event : (?P<event>.+)",
        ["Got async event"],
        "An InfiniBand port reported an asynchronous event ({event}): a flapping or failing link",
        "Check the cable, switch port and `ibv_devinfo` port state on that node; move the job off "
        "it until the link is stable.",
        examples=("NCCL WARN NET/IB : Got async event : port error",),
    ),
    rule(
        "nccl.ib_memlock",
        ERROR,
        r"ibv_reg_mr\w* failed with error Cannot allocate memory",
        ["ibv_reg_mr"],
        "NCCL could not register memory with the InfiniBand NIC: the locked-memory limit "
        "(ulimit -l) is too low",
        "Make memlock unlimited where the ranks run: `* - memlock unlimited` in "
        "/etc/security/limits.conf (then log in again or restart slurmd), `docker run --ulimit "
        "memlock=-1`; check `ulimit -l` from inside the launcher.",
        examples=(
            "misc/ibvwrap.cc:278 NCCL WARN Call to ibv_reg_mr_iova2 failed with error Cannot "
            "allocate memory",
        ),
    ),
    rule(
        "nccl.version_mismatch",
        ERROR,
        r"with family 0 is neither AF_INET",
        ["with family 0 is neither"],
        "NCCL received a peer address it cannot read (family 0): the nodes run different NCCL "
        "versions",
        "Use the same NCCL on every node: the same image, or pin the nvidia-nccl-cu* wheel; "
        "compare torch.cuda.nccl.version() and any libnccl-net plugin on all nodes.",
        examples=(
            "ncclSocketInit: connecting to address with family 0 is neither AF_INET(2) nor "
            "AF_INET6(10)",
        ),
    ),
    rule(
        "nccl.bad_socket_address",
        ERROR,
        r"with family (?P<family>[1-9]\d*) is neither AF_INET",
        ["is neither AF_INET"],
        _bad_address_summary,
        _bad_address_fix,
        emits=False,  # SocketIfnameAnalyzer: it names the NCCL_SOCKET_IFNAME the log set
        examples=(
            "ncclSocketInit: connecting to address  with family 59936 is neither AF_INET(2) nor "
            "AF_INET6(10)",
        ),
    ),
    rule(
        "nccl.mismatched_collective",
        ERROR,
        r"Mismatched collective detected, please check your collective calls at and around rank "
        r"(?P<rank>\d+)",
        ["Mismatched collective detected"],
        "NCCL detected mismatched collectives at and around rank {rank}: the ranks called "
        "different collectives, or the same one with different sizes",
        "Make every rank call the same collectives in the same order with the same tensor sizes; "
        "rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL to see both sides.",
        rank_groups=("rank",),
        examples=(
            "init.cc:1247 NCCL WARN Mismatched collective detected, please check your collective "
            "calls at and around rank 39.",
        ),
    ),
    rule(
        "nccl.p2p_ipc_refused",
        ERROR,
        r"peer access is not supported between these two devices|failed to open CUDA IPC handle",
        ["peer access is not supported", "failed to open CUDA IPC handle"],
        "CUDA refused peer-to-peer (P2P/IPC) access between two GPUs NCCL wanted to connect directly",
        "Set NCCL_P2P_DISABLE=1 (or a lower NCCL_P2P_LEVEL); in containers or VMs make all the "
        "node's GPUs visible to every rank and run with --ipc=host.",
        examples=(
            "z-pc:909608:910337 [0] transport/p2p.cc:238 NCCL WARN failed to open CUDA IPC handle "
            ": 217 peer access is not supported between these two devices",
        ),
    ),
    rule(
        "nccl.remote_error",
        ERROR,
        r"ncclRemoteError|NCCL error: remote process exi|remote process exiting prematurely",
        ["ncclRemoteError", "remote process exi"],
        "NCCL reports a remote failure: another rank exited or the network between them failed",
        "Find the first rank that failed (its traceback, or torchrun's Root Cause) and fix that; "
        "on InfiniBand look for NET/IB errors (error 12: set NCCL_IB_GID_INDEX, often 3 for RoCE v2).",
        consequence=True,
        examples=(
            "what(): NCCL error: remote process exited or there was a network error",
            "ncclRemoteError: A call failed possibly due to a network error or a remote process "
            "exiting prematurely.",
        ),
    ),
    rule(
        "nccl.torch_error",
        ERROR,
        r"NCCL error in: (?P<where>\S+?), (?P<what>[^,]+)",
        ["NCCL error in:"],
        "A NCCL call failed: {what}",
        "Rerun with NCCL_DEBUG=WARN (or INFO) so NCCL says why, then explain that log.",
        generic=True,
        explained_by="nccl.",
        examples=(
            "RuntimeError: NCCL error in: ../ProcessGroupNCCL.cpp:784, unhandled cuda error, NCCL "
            "version 2.7.8",
        ),
    ),
    rule(
        "nccl.warn",
        WARNING,
        r"NCCL WARN (?P<msg>.+)",
        ["NCCL WARN"],
        "NCCL warned: {msg}",
        "Read the lines around it (NCCL_DEBUG=INFO adds detail); a WARN names the failing "
        "subsystem (net, shm, p2p, init).",
        generic=True,
        split_by="msg",
        examples=("host:1:1 [0] NCCL WARN Something unexpected happened",),
    ),
    # Facts the analyzer below combines; classified as info for the live log panel.
    rule(
        "nccl.init",
        INFO,
        r"NCCL version \d|Init COMPLETE|Using network \w+",
        ["NCCL version", "Init COMPLETE", "Using network"],
        emits=False,
        fact=True,
        examples=("NCCL version 2.15.5+cuda11.8",),
    ),
)


# NCCL's INFO lines (src/misc/socket.cc), and the variable as shells and env dumps print it.
_IFNAME_SET = re.compile(
    r"NCCL_SOCKET_IFNAME(?: set by environment to | set to |=)[\"']?(?P<value>[^\s\"']+)"
)
_IFNAME_RULES = tuple(
    r for r in RULES if r.id in ("nccl.no_socket_interface", "nccl.bad_socket_address")
)


@dataclass
class _SocketHit:
    rule: LineRule
    groups: dict[str, str]
    evidence: EvidenceList = field(default_factory=EvidenceList)


class SocketIfnameAnalyzer:
    """NCCL's socket failures that a wrong NCCL_SOCKET_IFNAME causes, naming the value it had.

    The failure line itself never says which interface was asked for; an earlier INFO line of the
    same log does (`NCCL_SOCKET_IFNAME set by environment to eth2`), so the finding can name it.
    """

    def __init__(self) -> None:
        self._ifname: dict[str | None, tuple[str, SourceLine]] = {}  # file -> value, its line
        self._hits: dict[str, _SocketHit] = {}

    def feed(self, line: SourceLine) -> None:
        body = line.body
        if "NCCL_SOCKET_IFNAME" in body:
            setting = _IFNAME_SET.search(body)
            if setting:
                self._ifname[line.file] = (setting.group("value"), line)
        for found in _IFNAME_RULES:
            if any(n in body for n in found.needles):
                match = found.pattern.search(body)
                if match:
                    self._record(found, match, line)

    def _record(self, found: LineRule, match: re.Match[str], line: SourceLine) -> None:
        hit = self._hits.get(found.id)
        if hit is None:
            groups = {k: v for k, v in match.groupdict().items() if v is not None}
            hit = self._hits[found.id] = _SocketHit(found, groups)
        setting = self._ifname.get(line.file)
        if setting is not None and "ifname" not in hit.groups:
            hit.groups["ifname"] = setting[0]
            hit.evidence.add(setting[1], ())  # the setting is evidence, not a rank to blame
        hit.evidence.add(line)

    def end_file(self, file: str | None) -> None:
        self._ifname.pop(file, None)  # a value set in one log says nothing about another

    def finish(self) -> list[Candidate]:
        return [
            Candidate(
                Finding(
                    id=hit.rule.id,
                    severity=hit.rule.severity,
                    summary=render(hit.rule.summary, hit.groups),
                    fix=render(hit.rule.fix, hit.groups),
                    ranks=tuple(sorted(hit.evidence.ranks)),
                    evidence=hit.evidence.evidence(),
                )
            )
            for hit in self._hits.values()
        ]
