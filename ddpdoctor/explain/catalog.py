"""Every explainer in one place: the rule table, a fresh set of analyzers, and what each id means."""

from __future__ import annotations

import functools

from ddpdoctor.explain import (
    benign,
    c10d,
    ddp,
    gloo,
    nccl,
    nccl_init,
    python,
    ray,
    torchrun,
    watchdog,
)
from ddpdoctor.explain.log_rules import Analyzer, LineRule, RuleSet, RuleTable

# Order matters for classification: the first specific rule that matches names a line.
SOURCES = (nccl, watchdog, torchrun, gloo, c10d, ddp, ray, python, benign)

# What each finding id means (the README's table; tests check every id is listed).
DESCRIPTIONS: dict[str, str] = {
    "nccl.init": "facts from NCCL INFO lines: version, network, ranks whose init completed",
    "nccl.init_incomplete": "a NCCL process never reached Init COMPLETE while others did: the blocker",
    "nccl.versions_differ": "different `NCCL version` lines across the logs",
    "nccl.virtual_interface": "docker/veth/bridge/link-local interfaces among NCCL's sockets (error when a channel uses one)",
    "nccl.stub_libcuda": "NCCL loaded the libcuda stub instead of the driver's",
    "nccl.no_socket_interface": "`Bootstrap : no socket interface found` (NCCL_SOCKET_IFNAME)",
    "nccl.connect_retry": "`Call to connect returned ..., retrying`: firewall or wrong interface",
    "nccl.connect_failed": "`Connect to ADDR failed`: stale rendezvous file, firewall, wrong interface",
    "nccl.shm_exhausted": "/dev/shm too small or full for NCCL's shared memory",
    "nccl.duplicate_gpu": "two ranks on one GPU",
    "nccl.device_unknown": "torch guessed a rank's GPU (no set_device / device_id)",
    "nccl.ib_completion_error": "InfiniBand completion error (12: timeout, set NCCL_IB_GID_INDEX)",
    "nccl.ib_async_event": "InfiniBand async port event: a flapping link",
    "nccl.ib_memlock": "memlock ulimit too low for RDMA registration",
    "nccl.version_mismatch": "`family 0` address: different NCCL versions across nodes",
    "nccl.bad_socket_address": "an invalid address family: bad NCCL_SOCKET_IFNAME or versions",
    "nccl.mismatched_collective": "NCCL's own collective mismatch check fired",
    "nccl.p2p_ipc_refused": "CUDA refused P2P/IPC between two GPUs",
    "nccl.remote_error": "a remote rank exited or the network failed (a consequence)",
    "nccl.torch_error": "`NCCL error in: ...` without NCCL's own reason (rerun with NCCL_DEBUG=WARN)",
    "nccl.warn": "any other NCCL WARN line",
    "watchdog.timeout": "the NCCL watchdog caught a timed-out or failed collective (SeqNum, op, size)",
    "watchdog.rank_behind": "the rank that is behind: lowest last-completed work, or no watchdog line",
    "watchdog.mismatch": "ranks report different ops or sizes at one sequence number",
    "watchdog.heartbeat_stuck": "the heartbeat monitor killed a process whose watchdog was stuck",
    "watchdog.teardown": "`taking the entire process down`: a consequence, not the cause",
    "watchdog.flight_recorder_disabled": "set TORCH_NCCL_TRACE_BUFFER_SIZE to record collectives",
    "ray.worker_died": "Ray's word on a worker process that died: its exit type and detail",
    "ray.memory_killed": "Ray's memory monitor killed a worker: the node ran low on memory",
    "torchrun.failed": "torchrun's root-cause rank exited with a non-zero code",
    "torchrun.killed": "the root-cause rank was killed by SIGKILL (OOM killer or kill -9)",
    "torchrun.signal": "the root-cause rank died of another signal (SIGABRT, SIGSEGV, SIGBUS, ...)",
    "torchrun.local_rank_arg": "argparse rejected `--local-rank` (torch.distributed.launch), exit 2",
    "torchrun.sigterm_peers": "torchrun stopping the other ranks after a failure (a consequence)",
    "torchrun.stopped": "torchrun itself was stopped from outside (Ctrl-C, a time limit, ddpdoctor)",
    "run.diagnosis": "a run directory whose job ddpdoctor stopped: its diagnosis, not the SIGTERMs",
    "gloo.loopback": "gloo connected over 127.x: the hostname resolves to loopback",
    "gloo.connect_failed": "gloo's full mesh could not connect (firewall, GLOO_SOCKET_IFNAME)",
    "gloo.ifname_invalid": "GLOO_SOCKET_IFNAME names no interface (e.g. NCCL's `^lo` syntax)",
    "gloo.size_mismatch": "`Received data size doesn't match expected size`: a collective mismatch",
    "gloo.peer_closed": "connection closed or reset by a peer: that peer died first (a consequence)",
    "gloo.timeout": "a gloo collective timed out waiting for a peer",
    "gloo.monitored_barrier": "monitored_barrier names the rank that did not arrive",
    "c10d.port_in_use": "the rendezvous port is taken (EADDRINUSE)",
    "c10d.connect_timeout": "the store at MASTER_ADDR:MASTER_PORT could not be reached in time",
    "c10d.connect_failed": "connecting to the store failed on every address",
    "c10d.host_unknown": "a host name (the rendezvous endpoint) could not be resolved",
    "c10d.numeric_hostname": "an all-digit master host name read as an IPv4 number",
    "c10d.store_timeout": "`N/M clients joined`: ranks missing from the rendezvous",
    "c10d.rendezvous_timeout": "torchrun's rendezvous gave up: a node never joined in time",
    "c10d.store_wait_timeout": "a rank waited for store keys another rank never wrote",
    "c10d.env_missing": "env:// without RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT",
    "ddp.unused_parameters": "`Expected to have finished reduction`: parameters without gradients",
    "ddp.marked_ready_twice": "a gradient seen twice (reentrant checkpointing)",
    "ddp.grad_strides": "gradient strides differ from DDP's bucket views (a copy every step)",
    "ddp.model_mismatch": "the model differs across ranks at DDP construction",
    "ddp.collective_mismatch": "TORCH_DISTRIBUTED_DEBUG=DETAIL fingerprints: both ranks and ops",
    "ddp.syncbn_without_ddp": "SyncBatchNorm used outside DDP",
    "ddp.syncbn_cpu": "SyncBatchNorm given CPU tensors",
    "ddp.find_unused_unneeded": "find_unused_parameters=True without unused parameters (performance)",
    "python.exception": "the exception that ended a rank (final line of its traceback)",
    "python.interrupted": "a rank stopped on Ctrl-C",
    "python.dataloader_shm": "a DataLoader worker died of a bus error (/dev/shm)",
    "python.cuda_fork": "`Cannot re-initialize CUDA in forked subprocess`",
    "python.mp_bootstrap": "processes started without an `if __name__ == '__main__':` guard",
    "python.cuda_oom": "CUDA out of memory",
    "python.argparse_error": "the script rejected its command line",
}


@functools.cache
def rule_table() -> RuleTable:
    return RuleTable(all_rules())


def all_rules() -> tuple[LineRule, ...]:
    return tuple(r for source in SOURCES for r in source.RULES)


def new_analyzers(*, one_host: bool = False) -> list[Analyzer]:
    """A fresh set for one explain run (analyzers keep state across the files they read);
    `one_host`: the logs are of a job on one machine."""
    return [
        RuleSet(rule_table()),
        nccl_init.NcclAnalyzer(),
        nccl.SocketIfnameAnalyzer(),
        watchdog.WatchdogAnalyzer(),
        torchrun.TorchrunAnalyzer(),
        gloo.GlooAnalyzer(one_host=one_host),
        c10d.C10dConnectAnalyzer(),
        ddp.CollectiveMismatchAnalyzer(),
        python.TracebackAnalyzer(rule_table().explains),
    ]
