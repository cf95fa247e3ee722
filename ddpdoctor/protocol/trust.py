"""The trust boundary: what ddpdoctor acts on, and what it only explains.

A job's output can print anything: a torchrun failure table naming another rank's pid with
`exitcode: -9`, a traceback, text that reads like a verdict. Acting on it would let a healthy
job's print get it stopped (a rank that printed such a table once got a CRASH verdict and was
killed). So every fact is tagged by where it came from:

    OBSERVED   what ddpdoctor saw itself: the process table (a pid alive or gone), exit statuses
               of the processes it started, the runtime's events from inside each rank
    LAUNCHER   the output stream of ddpdoctor's own torchrun (torchrun.log of a script run):
               its ranks write to their own --log-dir files, so nothing a rank prints lands there
    JOB        text the job printed: the ranks' logs, and the whole output of a user's command
               (`ddpdoctor run -- torchrun|python|srun ...`), where the command's torchrun and
               its ranks share one stream

Only OBSERVED facts may set a rank's end, a verdict, or stop the job. A LAUNCHER or JOB report of
a rank's exit (torchrun's failure table) only *explains* an end ddpdoctor observed (the exit code
and the signal of a rank whose process it saw gone), or, when nothing can be observed (a rank on
another host; a run read after the fact), LAUNCHER's word stands in for the observation. JOB text
is shown as evidence, quoted, never acted on; a JOB report that ddpdoctor's observation
contradicts (a rank "killed" that is running, or finished cleanly) is demoted to information.
"""

from __future__ import annotations

from enum import Enum


class Origin(str, Enum):
    OBSERVED = "observed"
    LAUNCHER = "launcher"
    JOB = "job"


def agent_log_origin(launch_mode: str | None) -> Origin:
    """Whose text torchrun.log holds: ddpdoctor's torchrun's own (a script run, and run
    directories written before commands existed), or a user's command's whole output."""
    return Origin.JOB if launch_mode == "command" else Origin.LAUNCHER


def report_may_end_rank(origin: Origin, *, alive: bool | None, live: bool) -> bool:
    """Whether a report of a rank's exit (torchrun's table) may mark that rank ended.

    `alive`: ddpdoctor's own look at the rank's pid (None: not on this host, or not looked at
    yet); `live`: the job is being watched as it runs (False: a post-mortem, where every process
    is gone and the report only tells how each ended)."""
    if origin is Origin.OBSERVED or not live or alive is False:
        return True
    if alive is True:
        return False  # the process runs: no text says otherwise
    return origin is Origin.LAUNCHER
