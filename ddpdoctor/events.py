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
                   numel (sum), async (bool), bucket (int, DDP gradient buckets only)
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
"""

from __future__ import annotations

import json
from typing import Any

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
    }
)

# The name the world process group is recorded under in collective events.
DEFAULT_GROUP = "default"


def parse_event_line(line: bytes | str) -> dict[str, Any] | None:
    """One event from one line, or None for a blank, torn or foreign line (never raises)."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            return None
    line = line.strip()
    if not line or line[0] != "{":
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("kind"), str):
        return None
    rank = event.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool):
        return None
    return event


def encode_event(event: dict[str, Any]) -> str:
    """One line of JSON (no newline inside, however odd the values are)."""
    return json.dumps(event, separators=(",", ":"), default=str, ensure_ascii=False)
