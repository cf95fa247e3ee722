"""The torchrun command line and the ranks' environment for `ddpdoctor run`.

Pure functions of the launch plan, so the exact command and environment are unit-tested. torchrun
is started as `python -m torch.distributed.run` with the launcher's own interpreter, so the job runs
with the torch that ddpdoctor sees.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddpdoctor.protocol.rundir import ENV_RUN_DIR, RunDir

REFERENCE_MODULE = "ddpdoctor.reference"
BOOTSTRAP_MODULE = "ddpdoctor.runtime.bootstrap"
FLIGHT_RECORDER_ENTRIES = "2000"
GLOO_RECORDER_ENTRIES = "256"  # what gloo jobs read on demand (see job_env)
ENV_DDP_BUCKETS = "DDPDOCTOR_DDP_BUCKETS"  # read by ddpdoctor.runtime.ddp_hooks


DEFAULT_RDZV_PORT = 29400  # torchrun's port for an --rdzv-endpoint given without one


@dataclass(frozen=True)
class Rendezvous:
    """How the nodes of the job find each other; the defaults mean one node, `--standalone`."""

    nnodes: str | None = None  # "N" or "MIN:MAX", as torchrun takes it
    node_rank: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    join_timeout_s: int | None = None  # how long torchrun waits for every node to join

    @property
    def standalone(self) -> bool:
        """One node and no rendezvous given: torchrun's own local store on a free port."""
        explicit = (
            self.rdzv_backend,
            self.rdzv_endpoint,
            self.rdzv_id,
            self.master_addr,
            self.master_port,
            self.node_rank,
        )
        return self.nnodes in (None, "1", "1:1") and all(v is None for v in explicit)

    def meeting_point(self) -> tuple[str | None, int | None]:
        """The address every node must reach: --master-addr/--master-port, else the rendezvous
        endpoint (HOST[:PORT], torchrun's default port 29400), for the doctor's network checks."""
        if self.master_addr is not None or self.rdzv_endpoint is None:
            return self.master_addr, self.master_port
        host, sep, port = self.rdzv_endpoint.rpartition(":")
        if not sep or not port.isdigit():
            host, port = self.rdzv_endpoint, str(DEFAULT_RDZV_PORT)
        return host.strip("[]") or None, int(port)

    def argv(self) -> list[str]:
        if self.standalone:
            return ["--standalone"]
        args: list[str] = []
        for flag, value in (
            ("--nnodes", self.nnodes),
            ("--node-rank", self.node_rank),
            ("--rdzv-backend", self.rdzv_backend),
            ("--rdzv-endpoint", self.rdzv_endpoint),
            ("--rdzv-id", self.rdzv_id),
            ("--master-addr", self.master_addr),
            ("--master-port", self.master_port),
        ):
            if value is not None:
                args += [flag, str(value)]
        if self.join_timeout_s is not None:
            args += ["--rdzv-conf", f"{self.join_timeout_key}={self.join_timeout_s}"]
        return args

    @property
    def join_timeout_key(self) -> str:
        """The --rdzv-conf key for the join timeout: torchrun's static rendezvous (the default
        with --master-addr) calls it `timeout`, the c10d and etcd rendezvous `join_timeout`."""
        return "timeout" if self.rdzv_backend in (None, "static") else "join_timeout"


def program_argv(
    script: str | None, script_args: Sequence[str], reference_args: Sequence[str]
) -> list[str]:
    """What torchrun runs in each rank: the reference job, or the user's script (or `-m module`)
    through the bootstrap that instruments it and then runs it unchanged."""
    if script is None:
        return ["-m", REFERENCE_MODULE, *reference_args]
    return ["-m", BOOTSTRAP_MODULE, script, *script_args]


def torchrun_argv(
    *,
    nproc_per_node: int,
    rendezvous: Rendezvous,
    log_dir: Path,
    program: Sequence[str],
    python: str = sys.executable,
) -> list[str]:
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc_per_node),
        *rendezvous.argv(),
        # Per-rank stdout/stderr files under the run directory. No --tee: the launcher reads
        # the files back for display (launch/output_tail.py), so torchrun's own output, which
        # goes to torchrun.log, holds torchrun's lines only, as before.
        "--log-dir",
        str(log_dir),
        "--redirects",
        "3",
        *program,
    ]


def flight_recorder_env(
    torch_version: str | None, run_dir: RunDir
) -> list[tuple[tuple[str, ...], str]]:
    """NCCL flight-recorder settings for the installed torch: [((name, *aliases), value)].

    The variables were renamed: torch 2.8 and later read TORCH_FR_BUFFER_SIZE and
    TORCH_FR_DUMP_TEMP_FILE (torch 2.14's FlightRecorder reads
    getCvarInt({"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"})) and still accept the old
    TORCH_NCCL_* names as deprecated aliases; torch 2.3 to 2.7 know only TORCH_NCCL_TRACE_BUFFER_SIZE
    and TORCH_NCCL_DEBUG_INFO_TEMP_FILE; older ones have no flight recorder. Dump-on-timeout kept
    its name. The aliases are listed so that a user's value under any of them wins.
    """
    version = parse_version(torch_version)
    if version is None or version < (2, 3):
        return []
    dump_prefix = str(run_dir.nccl_dir / "fr_trace_rank_")  # torch appends the rank
    if version >= (2, 8):
        return [
            (("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"), FLIGHT_RECORDER_ENTRIES),
            (("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"), dump_prefix),
            (("TORCH_NCCL_DUMP_ON_TIMEOUT",), "1"),
        ]
    return [
        (("TORCH_NCCL_TRACE_BUFFER_SIZE",), FLIGHT_RECORDER_ENTRIES),
        (("TORCH_NCCL_DEBUG_INFO_TEMP_FILE",), dump_prefix),
        (("TORCH_NCCL_DUMP_ON_TIMEOUT",), "1"),
    ]


def parse_version(text: str | None) -> tuple[int, int] | None:
    """(major, minor) from "2.14.1+cu130"; None when unreadable."""
    if not text:
        return None
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def job_env(
    base: Mapping[str, str],
    *,
    run_dir: RunDir,
    backend: str,
    torch_version: str | None,
    ddp_buckets: bool = False,
) -> dict[str, str]:
    """The environment torchrun and the ranks get. The user's own values always win.

    `ddp_buckets` (--ddp-buckets): record every DDP gradient bucket with a Python comm hook
    instead of reading the flight recorder on demand (ddpdoctor.runtime.ddp_hooks)."""
    env = dict(base)
    env[ENV_RUN_DIR] = str(run_dir.path.resolve())
    if ddp_buckets:
        env[ENV_DDP_BUCKETS] = "1"
    # Ranks write to files (--redirects); unbuffered output keeps the console and logs live.
    env.setdefault("PYTHONUNBUFFERED", "1")
    if backend == "nccl":
        env.setdefault("NCCL_DEBUG", "INFO")
        env.setdefault("NCCL_DEBUG_FILE", run_dir.nccl_debug_file_pattern())
        for names, value in flight_recorder_env(torch_version, run_dir):
            if not any(name in base for name in names):
                env[names[0]] = value
    else:
        # torch 2.8 and later record gloo's collectives too: the ranks answer the monitor's
        # flight-recorder requests from it. The monitor reads the latest entries only, and a
        # dump's time (the GIL held) grows with the buffer: 2000 entries (torch's default) took
        # 76 ms on a loaded 2-core VM, so gloo jobs get a smaller ring. The dump-on-timeout
        # settings are NCCL's only.
        version = parse_version(torch_version)
        names = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
        if version is not None and version >= (2, 8) and not any(n in base for n in names):
            env[names[0]] = GLOO_RECORDER_ENTRIES
    return env
