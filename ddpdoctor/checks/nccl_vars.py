"""The NCCL_* (and TORCH_NCCL_*) environment variables NCCL and PyTorch read, with the values each
accepts, for spotting typos and bad values before a job starts.

Sources: the "Environment Variables" page of the NCCL user guide (2.4 to 2.30), the parameter names
compiled into libnccl.so.2 2.30.7, and the variable lists of torch 2.14's ProcessGroupNCCL.hpp.
NCCL ignores a name it does not know and, for most bad values, prints an INFO line (seen only with
NCCL_DEBUG=INFO) and uses its default: a typo silently does nothing.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")  # topology distances, nearest first
DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "ABORT", "TRACE")
DEBUG_SUBSYSTEMS = (
    "INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "CALL", "PROXY",
    "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS", "ALL",
)  # fmt: skip
ALGORITHMS = ("TREE", "RING", "COLLNETDIRECT", "COLLNETCHAIN", "NVLS", "NVLSTREE", "PAT")
PROTOCOLS = ("LL", "LL128", "SIMPLE")


@dataclass(frozen=True)
class VarSpec:
    name: str
    kind: str  # "bool", "int", "choice", "level", "list", "text"
    choices: tuple[str, ...] = ()
    low: int | None = None
    high: int | None = None
    note: str = ""  # why a value matters, used in messages


# Switches NCCL reads as 0/1 (any other value is an error NCCL reports only at INFO level).
_BOOLEANS = """
NCCL_P2P_DISABLE NCCL_SHM_DISABLE NCCL_IB_DISABLE NCCL_P2P_DIRECT_DISABLE NCCL_PXN_DISABLE
NCCL_NVB_DISABLE NCCL_NET_DISABLE_INTRA NCCL_NVTX_DISABLE NCCL_GDR_FLUSH_DISABLE NCCL_RMA_DISABLE
NCCL_NET_GDR_READ NCCL_NET_GDR_C2C NCCL_NET_SHARED_BUFFERS NCCL_NET_SHARED_COMMS NCCL_NET_FORCE_FLUSH
NCCL_P2P_READ_ENABLE NCCL_P2P_USE_CUDA_MEMCPY NCCL_SHM_USE_CUDA_MEMCPY NCCL_COLLNET_ENABLE
NCCL_CUMEM_ENABLE NCCL_CUMEM_HOST_ENABLE NCCL_CHECK_POINTERS NCCL_COMM_BLOCKING
NCCL_IGNORE_CPU_AFFINITY NCCL_SET_THREAD_NAME NCCL_SET_STACK_SIZE NCCL_RUNTIME_CONNECT
NCCL_GRAPH_REGISTER NCCL_LOCAL_REGISTER NCCL_LEGACY_CUDA_REGISTER NCCL_DMABUF_ENABLE
NCCL_IB_ADAPTIVE_ROUTING NCCL_IB_ECE_ENABLE NCCL_IB_MERGE_VFS NCCL_IB_MERGE_NICS
NCCL_IB_SPLIT_DATA_ON_QPS NCCL_IB_RETURN_ASYNC_EVENTS NCCL_IB_USE_INLINE NCCL_OOB_NET_ENABLE
NCCL_RAS_ENABLE NCCL_WIN_ENABLE NCCL_PAT_ENABLE NCCL_GRAPH_MIXING_SUPPORT NCCL_LAUNCH_ORDER_IMPLICIT
NCCL_NVLINK_UTIL_CENTRIC_SCHED_ENABLE NCCL_GDRCOPY_ENABLE NCCL_GDRCOPY_FIFO_ENABLE
NCCL_GDRCOPY_SYNC_ENABLE NCCL_GDRCOPY_FLUSH_ENABLE NCCL_COMM_SPLIT_SHARE_RESOURCES
NCCL_COMM_SHRINK_SHARE_RESOURCES NCCL_ALLGATHERV_ENABLE NCCL_NVB_PRECONNECT NCCL_P2P_EPOCH_ENABLE
NCCL_ALLOC_P2P_NET_LL_BUFFERS NCCL_IB_QUERY_PORT_SPEED NCCL_IB_OOO_RQ NCCL_SOCKET_INLINE
NCCL_MNNVL_SCATTER_NETS_ENABLE NCCL_MNNVL_CROSS_CLIQUE NCCL_SYM_TMA_ENABLE NCCL_GIN_ENABLE
NCCL_WARN_ENABLE_DEBUG_INFO NCCL_REPORT_CONNECT_PROGRESS NCCL_IB_WARN_RAIL_LOCAL
NCCL_IGNORE_NET_MISMATCH NCCL_IGNORE_COLLNET_MISMATCH NCCL_LAUNCH_RACE_FATAL
NCCL_MULTI_RANK_GPU_ENABLE NCCL_SINGLE_PROC_MEM_REG_ENABLE NCCL_LL128_C2C NCCL_PXN_C2C
NCCL_ENABLE_VERSION_CHECK NCCL_IB_DEVICE_PCI_ORDER NCCL_NET_OPTIONAL_RECV_COMPLETION
NCCL_DISABLE_MEM_MANAGER NCCL_MLOPART_RDMA_ENABLE NCCL_SYM_NOWIN_ENABLE NCCL_SYM_GIN_KERNELS_ENABLE
NCCL_UNPACK_DOUBLE_NCHANNELS NCCL_GRAPH_HELPER_DISABLE NCCL_IB_SUBNET_AWARE_ROUTING
NCCL_IB_RESILIENCY_PORT_FAILOVER NCCL_IB_RESILIENCY_PORT_RECOVERY NCCL_GDAKI_USE_RELIABLE_DB
"""

# Integer settings with the range the NCCL documentation gives (None: no documented bound).
_INTEGERS: dict[str, tuple[int | None, int | None]] = {
    "NCCL_SOCKET_NTHREADS": (1, 16),
    "NCCL_NSOCKS_PERTHREAD": (1, 64),
    "NCCL_SOCKET_RETRY_CNT": (0, None),
    "NCCL_SOCKET_RETRY_SLEEP_MSEC": (0, None),
    "NCCL_SOCKET_POLL_TIMEOUT_MSEC": (0, None),
    "NCCL_SOCKET_SNDBUF": (0, None),
    "NCCL_SOCKET_RCVBUF": (0, None),
    "NCCL_SOCKET_MIN_TASKSIZE": (0, None),
    "NCCL_IB_TIMEOUT": (0, 31),  # 5-bit field: 4.096 us * 2^value
    "NCCL_IB_RETRY_CNT": (0, 7),  # 3-bit field
    "NCCL_IB_GID_INDEX": (-1, None),  # -1: automatic (2.21+)
    "NCCL_IB_ROUTABLE_FLID_GID_INDEX": (-1, None),
    "NCCL_IB_SL": (0, 15),
    "NCCL_IB_TC": (0, 255),
    "NCCL_IB_FIFO_TC": (0, 255),
    "NCCL_IB_ROCE_VERSION_NUM": (1, 2),
    "NCCL_IB_QPS_PER_CONNECTION": (1, None),
    "NCCL_IB_AR_THRESHOLD": (0, None),
    "NCCL_IB_PCI_RELAXED_ORDERING": (0, 2),
    "NCCL_IB_DATA_DIRECT": (0, 2),
    "NCCL_IB_PKEY": (0, None),
    "NCCL_IB_MQP_RETRY_CNT": (0, None),
    "NCCL_IB_MQP_RETRY_SLEEP_MSEC": (0, None),
    "NCCL_IB_MQP_RETRY_ALL": (0, 1),
    "NCCL_CROSS_NIC": (0, 2),
    "NCCL_P2P_PXN_LEVEL": (0, 2),
    "NCCL_SHM_LOCALITY": (1, 2),
    "NCCL_SHM_MEMCPY_MODE": (1, 3),
    "NCCL_NVLS_ENABLE": (0, 2),
    "NCCL_MNNVL_ENABLE": (0, 2),
    "NCCL_MNNVL_CLIQUE_ID": (None, None),
    "NCCL_MNNVL_RAIL_PER_HOST": (0, None),
    "NCCL_IGNORE_DISABLED_P2P": (0, 2),
    "NCCL_BUFFSIZE": (1, None),
    "NCCL_LL_BUFFSIZE": (1, None),
    "NCCL_LL128_BUFFSIZE": (1, None),
    "NCCL_LL128_NTHREADS": (1, None),
    "NCCL_MAX_NCHANNELS": (1, None),
    "NCCL_MIN_NCHANNELS": (1, None),
    "NCCL_MAX_P2P_NCHANNELS": (1, None),
    "NCCL_MIN_P2P_NCHANNELS": (1, None),
    "NCCL_MAX_CTAS": (1, None),
    "NCCL_MIN_CTAS": (1, None),
    "NCCL_CGA_CLUSTER_SIZE": (0, 8),
    "NCCL_NCHANNELS_PER_NET_PEER": (1, None),
    "NCCL_NVLS_NCHANNELS": (1, None),
    "NCCL_P2P_NET_CHUNKSIZE": (1, None),
    "NCCL_P2P_PCI_CHUNKSIZE": (1, None),
    "NCCL_P2P_NVL_CHUNKSIZE": (1, None),
    "NCCL_NVLS_CHUNKSIZE": (1, None),
    "NCCL_NVLSTREE_MAX_CHUNKSIZE": (1, None),
    "NCCL_CHUNK_SIZE": (1, None),
    "NCCL_P2P_LL_THRESHOLD": (0, None),
    "NCCL_P2P_MAX_PEERS": (1, None),
    "NCCL_MAX_P2P_PEERS": (1, None),
    "NCCL_P2P_SCHEDULE_GROUP_SIZE": (1, None),
    "NCCL_P2P_PER_CHANNEL_NET_BW": (0, None),
    "NCCL_CONNECT_ROUND_MAX_PEERS": (1, None),
    "NCCL_WORK_FIFO_BYTES": (1, None),
    "NCCL_WORK_ARGS_BYTES": (1, None),
    "NCCL_COLLNET_NODE_THRESHOLD": (1, None),
    "NCCL_UID_STAGGER_THRESHOLD": (0, None),
    "NCCL_UID_STAGGER_RATE": (1, None),
    "NCCL_PROXY_APPEND_BATCH_SIZE": (1, None),
    "NCCL_PROGRESS_APPENDOP_FREQ": (1, None),
    "NCCL_RAS_TIMEOUT_FACTOR": (1, None),
    "NCCL_TOPO_DUMP_FILE_RANK": (0, None),
    "NCCL_GRAPH_DUMP_FILE_RANK": (0, None),
    "NCCL_SYM_CE_THRESHOLD": (0, None),
    "NCCL_SYM_CTAS": (0, None),
    "NCCL_L1_SHARED_MEMORY_CARVEOUT": (0, None),
    "NCCL_MEM_SYNC_DOMAIN": (0, None),
    "NCCL_NUM_RMA_CTX": (0, None),
    "NCCL_LSA_TEAM_SIZE": (0, None),
    "NCCL_WIN_STRIDE": (0, None),
    "NCCL_SHADOW_MEMPOOL_MAX_SIZE": (0, None),
    "NCCL_SET_CPU_STACK_SIZE": (0, None),
    "NCCL_GRAPH_STREAM_ORDERING": (0, None),
    "NCCL_CTA_POLICY": (0, None),
    "NCCL_GIN_NCONNECTIONS": (0, None),
    "NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS": (0, None),
    "NCCL_IB_SUBNET_PREFIX_LEN": (0, 128),
    "NCCL_IB_RECEIVER_SIDE_MATCHING_SCHEME": (0, None),
}
_POWERS_OF_TWO = ("NCCL_WORK_FIFO_BYTES",)  # NCCL ignores other values ("not a power of 2")

_CHOICES: dict[str, tuple[str, ...]] = {
    "NCCL_DEBUG": DEBUG_LEVELS,
    "NCCL_SOCKET_FAMILY": ("AF_INET", "AF_INET6"),
    "NCCL_IB_ADDR_FAMILY": ("AF_INET", "AF_INET6"),
    "NCCL_LAUNCH_MODE": ("PARALLEL", "GROUP"),
    "NCCL_NTHREADS": ("64", "128", "256", "512"),
}
_LEVELS = ("NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL")  # a LEVELS name or an integer 0..5
_LISTS: dict[str, tuple[str, ...]] = {  # comma lists; a leading ^ excludes instead
    "NCCL_DEBUG_SUBSYS": DEBUG_SUBSYSTEMS,
    "NCCL_ALGO": ALGORITHMS,
    "NCCL_PROTO": PROTOCOLS,
}

# Free-form values (names, paths, addresses, plugin names) checked elsewhere or not at all.
_TEXT = """
NCCL_SOCKET_IFNAME NCCL_IB_HCA NCCL_NET NCCL_NET_PLUGIN NCCL_TUNER_PLUGIN NCCL_PROFILER_PLUGIN
NCCL_ENV_PLUGIN NCCL_GIN_PLUGIN NCCL_RMA_PLUGIN NCCL_TOPO_FILE NCCL_TOPO_DUMP_FILE NCCL_GRAPH_FILE
NCCL_GRAPH_DUMP_FILE NCCL_DEBUG_FILE NCCL_CONF_FILE NCCL_COMM_ID NCCL_HOSTID NCCL_OOB_NET_IFNAME
NCCL_IB_ADDR_RANGE NCCL_RAS_ADDR NCCL_DEBUG_TIMESTAMP_FORMAT NCCL_DEBUG_TIMESTAMP_LEVELS
NCCL_PROXY_CPUSET NCCL_MNNVL_UUID NCCL_IBVERBS_LIB NCCL_THREAD_THRESHOLDS NCCL_CHECK_MODE
NCCL_TUNING NCCL_NETDEVS_POLICY NCCL_NET_MERGE_LEVEL NCCL_NET_MERGE_POLICY NCCL_NET_FORCE_MERGE
NCCL_NET_OVERHEAD NCCL_NET_GDR_MLOPART NCCL_GIN_TYPE NCCL_PROFILE_EVENT_MASK NCCL_IB_SL_DEFAULT
NCCL_IB_TC_DEFAULT NCCL_SYM_KERNEL NCCL_SYM_RS_GIN_CHUNK_SIZE NCCL_SYM_REUSE_SYSMEM_HANDLES
NCCL_TOPO_SPLIT_MLOPART NCCL_DEV_API_JIT NCCL_ELASTIC_BUFFER_REGISTER NCCL_MULTI_SEGMENT_REGISTER
NCCL_IPC_COLLECTIVE NCCL_IPC_SENDRECV NCCL_PROXY_DUMP_SIGNAL NCCL_RMA_PROXY_DUMP_SIGNAL
NCCL_RMA_PROXY_QUEUE_SIZE NCCL_NET_PLUGIN_REF_COUNT NCCL_GIN_PLUGIN_REF_COUNT
NCCL_RMA_PLUGIN_REF_COUNT NCCL_GIN_IB_TC NCCL_GIN_IB_ALLGATHER_TAG NCCL_GIN_IB_ALLTOALL_TAG
NCCL_GIN_ERROR_QUERY_SEC NCCL_GIN_PROXY_QUEUE_SIZE NCCL_GIN_GDAKI_QP_DEPTH NCCL_GIN_GDAKI_NIC_HANDLER
NCCL_GIN_GDAKI_MAX_QP_RD_ATOMIC NCCL_GIN_GDAKI_MAX_DEST_RD_ATOMIC NCCL_GIN_GDAKI_GPU_CONTEXT_VERSION
NCCL_GIN_GDAKI_GPU_CONTEXT_MAX_SIZE NCCL_GIN_PROXY_GPU_CONTEXT_VERSION
NCCL_GIN_PROXY_GPU_CONTEXT_MAX_SIZE NCCL_IB_RESILIENCY_PORT_FAILOVER_MAX_ATTEMPTS
NCCL_IB_RESILIENCY_PORT_FAILOVER_PROBE_DELAY NCCL_IB_RESILIENCY_PORT_RECOVERY_ACK_TIMEOUT
NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_INTERVAL
NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_BATCH_SIZE
NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_SEQUENCE_SIZE
NCCL_IB_RESILIENCY_PORT_RECOVERY_ALIVE_MSG_TIMEOUT NCCL_IB_RESILIENCY_PORT_RECOVERY_ATTEMPTS_MAX
NCCL_IB_RESILIENCY_PORT_RECOVERY_START_DELAY NCCL_GRAPH_DUMP_FILE_RANK
"""

# TORCH_NCCL_* variables of torch's ProcessGroupNCCL, for typo suggestions and value checks.
_TORCH_TEXT = """
TORCH_NCCL_ASYNC_ERROR_HANDLING TORCH_NCCL_AVOID_RECORD_STREAMS TORCH_NCCL_BCAST_UNIQUEID
TORCH_NCCL_BLOCKING_WAIT TORCH_NCCL_COORD_CHECK_MILSEC TORCH_NCCL_CUDA_EVENT_CACHE
TORCH_NCCL_DEBUG_INFO_PIPE_FILE TORCH_NCCL_DEBUG_INFO_TEMP_FILE TORCH_NCCL_DESYNC_DEBUG
TORCH_NCCL_DUMP_ON_TIMEOUT TORCH_NCCL_ENABLE_MONITORING TORCH_NCCL_ENABLE_TIMING
TORCH_NCCL_EXTRA_DUMP_ON_EXEC TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC TORCH_NCCL_HIGH_PRIORITY
TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN TORCH_NCCL_NAN_CHECK TORCH_NCCL_NONBLOCKING_TIMEOUT
TORCH_NCCL_PROPAGATE_ERROR TORCH_NCCL_RANKS_PER_ROOT TORCH_NCCL_RETHROW_CUDA_ERRORS
TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_WARNING TORCH_NCCL_TRACE_BUFFER_SIZE
TORCH_NCCL_TRACE_CPP_STACK TORCH_NCCL_USE_COMM_NONBLOCKING
TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC
"""
TORCH_NAMES = tuple(_TORCH_TEXT.split())
_TORCH_CHOICES = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("0", "1", "2", "3"),
    "TORCH_NCCL_BLOCKING_WAIT": ("0", "1"),
    "TORCH_NCCL_DESYNC_DEBUG": ("0", "1"),
    "TORCH_NCCL_ENABLE_TIMING": ("0", "1"),
    "TORCH_NCCL_DUMP_ON_TIMEOUT": ("0", "1"),
    "TORCH_NCCL_ENABLE_MONITORING": ("0", "1"),
}

# Old names: the replacement and what happens to the old one.
RENAMED: dict[str, tuple[str | None, str]] = {
    "NCCL_ASYNC_ERROR_HANDLING": (
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "torch still reads the old name but warns that it is deprecated",
    ),
    "NCCL_BLOCKING_WAIT": (
        "TORCH_NCCL_BLOCKING_WAIT",
        "torch still reads the old name but warns that it is deprecated",
    ),
    "NCCL_DESYNC_DEBUG": ("TORCH_NCCL_DESYNC_DEBUG", "torch reads the old name with a warning"),
    "NCCL_ENABLE_TIMING": ("TORCH_NCCL_ENABLE_TIMING", "torch reads the old name with a warning"),
    "NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": (
        "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK",
        "torch reads the old name with a warning",
    ),
    "NCCL_IB_CUDA_SUPPORT": ("NCCL_NET_GDR_LEVEL", "NCCL 2.4 replaced it; it is ignored"),
    "NCCL_MAX_NRINGS": ("NCCL_MAX_NCHANNELS", "deprecated since NCCL 2.5"),
    "NCCL_MIN_NRINGS": ("NCCL_MIN_NCHANNELS", "deprecated since NCCL 2.5"),
    "NCCL_CHECKS_DISABLE": ("NCCL_CHECK_POINTERS", "NCCL 2.2.12 replaced it; it is ignored"),
    "NCCL_LL_THRESHOLD": ("NCCL_PROTO", "removed in NCCL 2.5; it is ignored"),
    "NCCL_TREE_THRESHOLD": ("NCCL_ALGO", "removed in NCCL 2.5; it is ignored"),
    "NCCL_SINGLE_RING_THRESHOLD": (None, "removed; it is ignored"),
    "NCCL_RINGS": (None, "removed in NCCL 2.x; rings come from the topology search"),
    "NCCL_MAX_RINGS": ("NCCL_MAX_NCHANNELS", "removed; it is ignored"),
    "NCCL_MIN_RINGS": ("NCCL_MIN_NCHANNELS", "removed; it is ignored"),
}


# Variables that container images and distro packages set in every shell to record which NCCL
# they installed; NCCL and torch never read them. NVIDIA's CUDA and PyTorch images set
# NCCL_VERSION (e.g. 2.21.5-1) next to NV_LIBNCCL_*; only the NCCL_ prefixed names reach the
# variable lint, and they must not get a did-you-mean (NCCL_VERSION is close to
# NCCL_IB_ROCE_VERSION_NUM) or a warning that fails `doctor --strict` in every such container.
# The recorded version can differ from the NCCL torch loads (pytorch/pytorch#122571).
IMAGE_SET: frozenset[str] = frozenset({"NCCL_VERSION"})
IMAGE_NOTE = "set by the container image; NCCL does not read it"


def is_image_set(name: str) -> bool:
    return name in IMAGE_SET


def _build() -> dict[str, VarSpec]:
    table: dict[str, VarSpec] = {}
    for name in _TEXT.split():
        table[name] = VarSpec(name, "text")
    for name in _BOOLEANS.split():
        table[name] = VarSpec(name, "bool", choices=("0", "1"))
    for name, (low, high) in _INTEGERS.items():
        table[name] = VarSpec(name, "int", low=low, high=high)
    for name, choices in _CHOICES.items():
        table[name] = VarSpec(name, "choice", choices=choices)
    for name in _LEVELS:
        table[name] = VarSpec(name, "level", choices=LEVELS, low=0, high=5)
    for name, choices in _LISTS.items():
        table[name] = VarSpec(name, "list", choices=choices)
    for name in TORCH_NAMES:
        choices = _TORCH_CHOICES.get(name, ())
        table[name] = VarSpec(name, "choice" if choices else "text", choices=choices)
    return table


KNOWN: dict[str, VarSpec] = _build()


def is_known(name: str) -> bool:
    return name in KNOWN


def nearest_names(name: str, candidates: Iterable[str] | None = None, n: int = 1) -> list[str]:
    """The closest known names, best first; [] when nothing is close enough.

    Names are compared without their shared prefix (NCCL_ or TORCH_NCCL_), which would otherwise
    make every NCCL_ name look alike; a name that is part of a known one (NCCL_IFNAME for
    NCCL_SOCKET_IFNAME) counts as close too.
    """
    names = set(candidates) if candidates is not None else set(KNOWN)
    if name.startswith("NCCL_") and "TORCH_" + name in names:
        return ["TORCH_" + name]  # a torch setting written without its TORCH_ prefix
    prefix = "TORCH_NCCL_" if name.startswith("TORCH_NCCL_") else "NCCL_"
    pool = {
        known[len(prefix) :]: known for known in names if known.startswith(prefix) and known != name
    }
    stem = name[len(prefix) :] if name.startswith(prefix) else name
    close = difflib.get_close_matches(stem, sorted(pool), n=n, cutoff=0.7)
    if not close and len(stem) >= 4:
        close = sorted((k for k in pool if stem in k), key=len)[:n]
    return [pool[k] for k in close]


def value_problem(name: str, value: str) -> str | None:
    """Why `value` is wrong for `name`, in words; None when it is fine (or not checkable)."""
    spec = KNOWN.get(name)
    if spec is None:
        return None
    text = value.strip()
    if spec.kind == "bool":
        return None if text in ("0", "1") else f"{name}={value!r} is not 0 or 1"
    if spec.kind == "int":
        return _int_problem(spec, text)
    if spec.kind == "choice":
        if text.upper() in (c.upper() for c in spec.choices):
            return None
        return f"{name}={value!r} is not one of {', '.join(spec.choices)}"
    if spec.kind == "level":
        if text.upper() in spec.choices:
            return None
        if text.lstrip("-").isdigit() and 0 <= int(text) <= 5:
            return None
        return f"{name}={value!r} is not a level ({', '.join(spec.choices)}) or an integer 0..5"
    if spec.kind == "list":
        return _list_problem(spec, text)
    return None


def _int_problem(spec: VarSpec, text: str) -> str | None:
    try:
        number = int(text, 0)
    except ValueError:
        return f"{spec.name}={text!r} is not an integer"
    if spec.low is not None and number < spec.low:
        return f"{spec.name}={number} is below the minimum {spec.low}"
    if spec.high is not None and number > spec.high:
        return f"{spec.name}={number} is above the maximum {spec.high}"
    if spec.name in _POWERS_OF_TWO and number & (number - 1):
        return f"{spec.name}={number} is not a power of 2 (NCCL ignores it)"
    return None


def _list_problem(spec: VarSpec, text: str) -> str | None:
    # NCCL_ALGO also takes per-collective lists: "allreduce:tree,ring;broadcast:ring".
    bad: list[str] = []
    for part in text.split(";"):
        tokens = part.split(":", 1)[-1].lstrip("^")
        for token in tokens.split(","):
            token = token.strip()
            if token and token.upper() not in spec.choices:
                bad.append(token)
    if not bad:
        return None
    return f"{spec.name} has unknown entries {', '.join(bad)} (valid: {', '.join(spec.choices)})"


def value_fix(name: str) -> str:
    """What to set instead, naming the accepted values."""
    spec = KNOWN.get(name)
    if spec is None:
        return f"check the value of {name} in the NCCL documentation"
    if spec.kind == "bool":
        return f"set {name}=1 (on) or {name}=0 (off)"
    if spec.kind == "int":
        low = "" if spec.low is None else str(spec.low)
        high = "" if spec.high is None else str(spec.high)
        bounds = f" in {low}..{high}" if low or high else ""
        extra = ", a power of 2" if name in _POWERS_OF_TWO else ""
        return f"set {name} to an integer{bounds}{extra}"
    if spec.kind == "level":
        return f"set {name} to one of {', '.join(spec.choices)}"
    if spec.kind == "list":
        return f"set {name} to a comma list of {', '.join(spec.choices)} (a leading ^ excludes)"
    return f"set {name} to one of {', '.join(spec.choices)}"
