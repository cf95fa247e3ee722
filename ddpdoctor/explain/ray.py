"""Ray's word on a worker that died: the exit type and detail Ray prints when an actor's or a
task's worker process is gone, and its memory monitor's kills.

Text of the job's output: evidence that names the cause of a death ddpdoctor observed itself (a
rank that vanished inside its training function or method), never the reason for a verdict.
"""

from __future__ import annotations

from ddpdoctor.explain.log_rules import rule
from ddpdoctor.findings import Severity

WARNING, INFO = Severity.WARNING, Severity.INFO

RULES = (
    rule(
        "ray.worker_died",
        INFO,
        r"Worker exit type: (?P<type>[A-Z_]{1,40}) Worker exit detail: (?P<detail>[^.]{0,300})",
        ["Worker exit type:"],
        "Ray says a worker process died ({type}): {detail}",
        "A connection error of a worker that was running means it was killed (SIGKILL: the "
        "kernel's OOM killer, see `dmesg`; Ray's memory monitor says so itself) or crashed; the "
        "rank that died first is the one to look at.",
        split_by="type",
        examples=(
            "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this "
            "task. The actor is dead because its worker process has died. Worker exit type: "
            "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error "
            "code 2. End of file. Some common causes include: (1) the process was killed by the "
            "OOM killer due to high memory usage",
        ),
    ),
    rule(
        "ray.memory_killed",
        WARNING,
        r"killed due to the node running low on memory",
        ["running low on memory"],
        "Ray's memory monitor killed a worker: the node was running low on memory",
        "Give each worker less to hold (smaller batches, fewer workers per node) or the node more "
        "memory; RAY_memory_usage_threshold sets when Ray's memory monitor kills.",
        examples=(
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on "
            "memory. Memory on the node (IP: 10.0.0.5, ID: 1a2b) where the task (actor ID: 3c4d, "
            "name=RayTrainWorker.__init__, pid=4242, memory used=7.10GB) was running was "
            "7.50GB / 7.70GB (0.97), which exceeds the memory usage threshold of 0.95.",
        ),
    ),
)
