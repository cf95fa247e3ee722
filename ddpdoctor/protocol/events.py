"""The event schema: what each rank writes to RUN_DIR/events/rank-<R>.jsonl, one JSON object a line.

Writers (ddpdoctor/runtime/) flush every line. Readers (ddpdoctor/monitor/) tolerate a torn last line,
unknown kinds and unknown fields, so the schema can grow without breaking old watchers.

Every event carries the envelope

    {"v": 1, "t": <unix time, float>, "mono": <time.monotonic(), float>, "rank": R, "kind": ...}

and, by kind, these fields (a field may be null where the rank does not know it):

hello              local_rank, world_size, local_world_size, group_rank, host, pid, ppid, backend
                   ("gloo"|"nccl"|null before init), device ("cpu"|"cuda:N"), argv [str], script,
                   versions {python, torch, ddpdoctor, nccl, cuda}, run_id
heartbeat          seq (heartbeat counter), step, epoch, phase, rss_bytes, gpu_mem_bytes,
                   open {op, seq, group, since_t, since_mono} | null   (the collective in progress),
                   collectives_started, collectives_done (per-process counters, all groups)
collective_start   op, seq (per process and group, starting at 1), group (name: "default" for the
                   world group), group_size, group_ranks [int] | null, shapes [[int]], dtypes [str],
                   numel (sum), async (bool), bucket (int, DDP gradient buckets only),
                   step (the training step it was made in; absent before the first)
collective_end     op, seq, group, duration_s, ok (bool), error (str | null)
step               step (1-based training steps done on this rank), epoch, loss, batch_size,
                   step_time_s, data_time_s, compute_time_s, comm_wait_s, samples_per_s
phase              phase ("init"|"data"|"train"|"eval"|"checkpoint"|"shutdown"|user text)
epoch              epoch, batches (len of this rank's loader), samples (len of its sampler),
                   shuffle, set_epoch_called (bool)
metrics            whatever ddpdoctor.log(**values) was given (step and loss are understood)
warning            code (dotted id, e.g. "sampler.set_epoch_missing"), message, details {..}
fault              inject (the --inject spec text), fault ("hang"|"crash"|...), step
error              exc_type, message, traceback (str), thread (name), fatal (bool)
exit               code (int | null), reason ("normal"|"exception"|"signal"|"sys.exit"|...)
ray_call           state ("busy": the user's code started running in this Ray worker | "idle":
                   none of it runs any more), call (the actor method's name, or "train_fn" for
                   Ray Train's training function), ok (bool, on "idle": it returned without an
                   exception), max_failures (on "busy" of train_fn: Ray Train's
                   FailureConfig(max_failures), -1 unlimited, where readable). Ray ends a worker without exit handlers once its work is done:
                   a rank that vanishes while idle finished; one that vanishes busy died.
replica_digest     model (index of the replica in the order it first trained), replica ("ddp" |
                   "hsdp": a replicate group's shards | "zero": a ZeroRedundancyOptimizer's
                   parameters), peers [int] (the global ranks holding the same replica, when
                   not every rank), step (steps
                   finished: the same on every rank), final (bool: at the end of the training),
                   buffers (bool: buffers digested, right after DDP broadcast them),
                   sync_buffers (the model's broadcast_buffers), every (K), digests [int: the
                   bit-sum of each tensor], names [str] (only when they changed since the
                   rank's last digest of the model), calls [{what, site, ddp, count, steps}]
                   (the writes outside the optimizer counted so far), cost_s. Queued.

Further fields the runtime (ddpdoctor/runtime/) writes, and what it means by them. (Timing: hello,
heartbeat, warning, fault, error, exit, ray_call and step are written at once (a step when it
closes, with everything queued before it); collective, epoch, phase and metrics events are queued
on the training thread and written, in order, within ~20 ms by the heartbeat thread, or before
the next immediate event.)

hello              ray, in a Ray worker: {actor_name, actor_class, actor_id, job_id, node_id,
                   node_ip, worker_id, busy (the user's code runs), calls [names]}
                   (runtime/ray_worker.py).
hello              also restart_count and max_restarts (torchrun's TORCHELASTIC_RESTART_COUNT and
                   TORCHELASTIC_MAX_RESTARTS: the attempt the rank belongs to, and the restart
                   budget), heartbeat_s (the heartbeat period: a watcher can judge a heartbeat's
                   age by it). A rank says hello when the runtime starts (backend null) and again
                   when init_process_group returns (backend, world_size and device then known):
                   the latest hello wins. parent ({"pid", "argv"}: the process that started the
                   rank, its launcher);
                   env_from ("slurm") and env_filled (the names) when ddpdoctor filled torch's
                   variables from a launcher's (runtime/autostart.py). A rank started by a user's
                   own command (autostart) says hello only once it has joined a process group.
                   Also pg_timeout_s (the default process group's timeout: init_process_group's
                   timeout=, else torch's default for the backend) and pg_timeout_given (bool).
                   buckets: how DDP's gradient buckets are recorded, {"mode": "flight_recorder"
                   (the default: DDP's C++ all-reduce, state read from PyTorch's flight recorder
                   on request) | "python_hook" (every bucket as events: DDPDOCTOR_DDP_BUCKETS=1,
                   or no usable recorder) | "off", "why": text}; absent until the DDP hooks are
                   installed.
heartbeat          open also carries p2p (bool), peer (int | null) and, for a batch of
                   point-to-point ops, peers (their global ranks). step is the number of
                   steps done (closed); seq starts at 1. Progress facts (cumulative, for telling a
                   busy rank from a blocked one): cpu_s (process CPU seconds), runq_s (the main
                   thread's run-queue wait, seconds), io_bytes (rchar + wchar), child_cpu_s (CPU
                   seconds of the main thread's live child processes), frame (the main
                   thread's innermost frame, "file.py:LINE function") and where (its innermost
                   frame in the user's own code). The main thread is the user's thread unless the
                   user's code runs on another one only (Ray Train's "TrainingThread(...)"):
                   frame and where are then that thread's, and thread names it.
collective_start   p2p (true) and peer (the other rank's GLOBAL rank, also for group_dst /
                   group_src; null for a batch_isend_irecv with several peers) on point-to-point
                   ops only, with tag when not 0, and p2p_ops ([[op, peer, tag], ...], the first
                   16) on batch_isend_irecv. Their seq counts per group AND peer, apart from the
                   collectives' seq, so ranks that take no part in a send do not look behind:
                   compare collective seqs across ranks on events without p2p. Only the outermost
                   call counts (all_gather_object is one collective, not its inner all_gathers).
                   DDP gradient buckets are op "all_reduce" with bucket (index) in DDP's group.
                   site (explicit collectives, not gradient buckets; absent when no frame of
                   the user's code is on the stack): where the call was made, {"file" (the
                   user's file, as Python names it), "line", "function" (qualified name), "via":
                   {"file" (its path inside site-packages), "line", "function"} | null (the
                   framework function the user's frame called: "DDPStrategy.barrier",
                   "LightningModule.log", "Accelerator.gather"), "issuer": {...} (the framework
                   frame that called torch.distributed, when not via itself)}. User code is
                   what is not in the standard library, site-packages, torch or ddpdoctor.
                   torch's Join (JOIN_FILE) is a framework: its calls say via Join.__exit__
                   (a rank out of data shadowing the others') or Join.notify_join_context.
pipeline           a pipeline schedule's first step() (torch.distributed.pipelining): schedule
                   (class name), microbatches, num_stages, stages (this rank's stage indices),
                   site and stage_site (the user's lines that built the schedule and the stage:
                   {file, line, function} | null). Heartbeats then carry pipeline: [step,
                   action ("step", "F", "B", "W"), microbatch | null, stage | null], the rank's
                   position in its schedule.
collective_end     via: how the end was seen, "return" (a blocking call returned), "future" (its
                   future completed), "work" (Work.is_completed() polled) or "cuda_event" (a CUDA
                   event recorded after a blocking GPU op passed); p2p and peer as at the start.
                   A failed op has ok false and error "Type: message".
step               forwards (training forwards in the step: more than 1 when no_sync micro-batches
                   accumulate into it). A step closes at the next iteration, a phase change, the
                   end of its loader or the process, so its event follows its metrics. step_time_s
                   = data_time_s + compute_time_s + comm_wait_s; comm_wait_s is blocking
                   collectives of the training thread plus the gradient all-reduce time not hidden
                   behind backward. Both are null for a DDP model's first steps, until DDP's
                   own timers (which time that all-reduce) have been read. batch_size sums the
                   leading dimension of the training forwards' first tensor argument (null when
                   unknown). A step is a DDP forward with grad and gradient sync that trained:
                   confirmed by an optimizer step, a gradient bucket or train mode (Lightning
                   trains with its DDP wrapper in eval mode); without any DDP forward, each
                   optimizer step (forwards 0).
phase              previous (the phase it replaces). Repeating the current phase writes nothing.
epoch              loader (per-process number of the DataLoader, in order of first use),
                   distributed (its sampler is a DistributedSampler), batch_size, drop_last,
                   num_workers, join (true when the epoch starts inside an open, enabled
                   `with Join(...)`, which evens ranks of different batch counts by design).
                   Written when iteration over the loader starts; epoch is the
                   sampler's epoch (DistributedSampler) or the count of earlier iterations.
metrics            step is added when not given (the step in progress). A metric named like an
                   envelope field (v, t, mono, rank, kind) is written as user_<name>; tensors and
                   numpy scalars become numbers; nan / inf become the strings "nan", "inf", "-inf".
warning            codes the runtime writes: sampler.set_epoch_missing, ddp.builtin_comm_hook
                   (the model's buckets go unrecorded), ddp.comm_hook_failed, runtime.hook_failed.
error              location {file, line, function}: the innermost frame outside the stdlib,
                   site-packages and the runtime's own hooks (the user's line), or null.
exit               signal ("SIGTERM", ...) when reason is "signal"; code is then minus the
                   signal number, as torchrun reports it. Reasons: "normal" (code 0), "sys.exit",
                   "exception" (code 1), "signal". Written at interpreter exit; a rank ended by
                   os._exit or SIGKILL writes none, and that absence means it died.

More on when the runtime writes (refining the timing note above):

collective_start   of every op but a DDP gradient bucket is written at once: on disk, behind
                   everything queued before it, before the call is entered. A rank that dies in
                   the call (gloo aborts the process with SIGABRT on a size mismatch) has said
                   what it called and with which shapes. Gradient buckets' starts and all ends
                   are queued.
(queued events)    while they keep coming (a training loop) the heartbeat thread writes them in
                   bursts every ~0.1 s; the first one after a quiet spell within ~20 ms.
phase              until the script names a phase itself (ddpdoctor.phase), the runtime names it:
                   "train" at a DDP forward in train mode with grad enabled or at an optimizer
                   step, "eval" at a forward under torch.no_grad() / inference_mode. Under
                   Lightning the trainer's own: "sanity_check", "train", "validate", "test",
                   "predict". From the script's first phase() (or Lightning's first) on, only
                   those phases are written.
"""

from __future__ import annotations

import re
from typing import Any

from ddpdoctor.protocol import jsontext

SCHEMA_VERSION = 1

HELLO = "hello"
HEARTBEAT = "heartbeat"
COLLECTIVE_START = "collective_start"
COLLECTIVE_END = "collective_end"
STEP = "step"
PHASE = "phase"
EPOCH = "epoch"
METRICS = "metrics"
WARNING = "warning"
FAULT = "fault"
ERROR = "error"
EXIT = "exit"
RAY_CALL = "ray_call"
PIPELINE = "pipeline"
REPLICA_DIGEST = "replica_digest"

KINDS = frozenset(
    {
        HELLO,
        HEARTBEAT,
        COLLECTIVE_START,
        COLLECTIVE_END,
        STEP,
        PHASE,
        EPOCH,
        METRICS,
        WARNING,
        FAULT,
        ERROR,
        EXIT,
        RAY_CALL,
        PIPELINE,
        REPLICA_DIGEST,
    }
)

# The name the world process group is recorded under in collective events.
DEFAULT_GROUP = "default"


# The most ranks a run directory is read for: a rank number or world size beyond it (a crafted or
# corrupted file) is not believed, so no reader allocates per rank up to a number a file made up.
MAX_RANKS = 1 << 16


# The runtime writes a step as one fixed template (ddpdoctor/runtime/records.py): the most
# frequent line by far, read by every watcher, so it is matched here instead of parsed as JSON.
# Each field is a run of one character class between fixed texts, so the match is linear in the
# line. Any other line, a step written differently (older runtimes, a non-finite loss) included,
# goes to json.loads as before.
_NUM = rb"(-?[0-9][0-9.eE+-]*)"
_NUM_OR_NULL = rb"(-?[0-9][0-9.eE+-]*|null)"
_STEP_FAST = re.compile(
    rb'\{"v":1,"t":' + _NUM + rb',"mono":' + _NUM + rb',"rank":([0-9]+),"kind":"step","step":'
    rb'(-?[0-9]+),"epoch":(-?[0-9]+|null),"loss":'
    + _NUM_OR_NULL
    + rb',"batch_size":([0-9]+|null),"forwards":([0-9]+),"step_time_s":'
    + _NUM
    + rb',"data_time_s":'
    + _NUM
    + rb',"compute_time_s":'
    + _NUM_OR_NULL
    + rb',"comm_wait_s":'
    + _NUM_OR_NULL
    + rb',"samples_per_s":'
    + _NUM_OR_NULL
    + rb"\}[ \t\r]*"
)


def _opt(text: bytes, kind: type) -> Any:
    return None if text == b"null" else kind(text)


def parse_step_line(line: bytes) -> dict[str, Any] | None:
    """The runtime's step line as the dict json.loads would give, or None for any other line."""
    m = _STEP_FAST.fullmatch(line)
    if m is None:
        return None
    g = m.groups()
    try:
        return {
            "v": 1,
            "t": float(g[0]),
            "mono": float(g[1]),
            "rank": int(g[2]),
            "kind": STEP,
            "step": int(g[3]),
            "epoch": _opt(g[4], int),
            "loss": _opt(g[5], float),
            "batch_size": _opt(g[6], int),
            "forwards": int(g[7]),
            "step_time_s": float(g[8]),
            "data_time_s": float(g[9]),
            "compute_time_s": _opt(g[10], float),
            "comm_wait_s": _opt(g[11], float),
            "samples_per_s": _opt(g[12], float),
        }
    except ValueError:  # "1e5e5" has the characters of a number but is none: the slow path
        return None


def parse_event_line(line: bytes | str) -> dict[str, Any] | None:
    """One event from one line, or None for a blank, torn or foreign line (never raises)."""
    if isinstance(line, bytes):
        if line[:11] == b'{"v":1,"t":' and b'"kind":"step"' in line[:80]:
            fast = parse_step_line(line)
            if fast is not None:
                return fast
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            return None
    line = line.strip()
    if not line or line[0] != "{":
        return None
    try:
        event = jsontext.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("kind"), str):
        return None
    rank = event.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool):
        return None
    return event


def encode_event(event: dict[str, Any]) -> str:
    """One line of JSON (no newline inside, however odd the values are; NaN and inf as null)."""
    return jsontext.dumps(event, separators=(",", ":"), default=str, ensure_ascii=False)


# torch.distributed.algorithms.join, as a site's "via" names its file: a rank out of data under
# `with Join(...)` shadows the others' collectives from Join.__exit__, which they reach only at
# their own end; its calls pair with theirs by design (never a chance pairing)
JOIN_FILE = "torch/distributed/algorithms/join.py"
