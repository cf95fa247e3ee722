"""rendezvous: a job over several nodes whose ranks wait for a node that never joins.

torchrun starts no rank until every node's agent has joined its rendezvous, and by default waits
600 s for the last one. Meanwhile every rank shows as "starting", which says nothing about why.
Each `ddpdoctor run --node-rank N` records itself in the shared run directory as it starts
(ddpdoctor.protocol.node_records), so the launchers missing there are the nodes being waited for.
`run.nodes_missing` names them, with the command to start there, while the run waits (information
at first, a warning once the wait is long) and as an error once the job ended without starting.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.judge.rules import RuleOutcome, fmt_s
from ddpdoctor.monitor.model.snapshot import Snapshot
from ddpdoctor.rank_ranges import named_ranks

NODES_MISSING = "run.nodes_missing"
# Launchers started by hand or by a scheduler on each node join within seconds of each other;
# half a minute without one usually means it was never started or cannot reach the endpoint.
LONG_JOIN_WAIT_S = 30.0


def detect(snap: Snapshot) -> RuleOutcome | None:
    if not snap.nodes_missing:
        return None
    nodes = named_ranks(snap.nodes_missing, "node")
    waited = snap.elapsed_s
    if snap.live:
        severity = Severity.INFO
        if waited is not None and waited >= LONG_JOIN_WAIT_S:
            severity = Severity.WARNING
        summary = (
            f"waiting for {nodes} to join the rendezvous ({fmt_s(waited)} so far): no rank "
            "starts until every node has joined, and no launcher of it has written to this "
            "run directory yet"
        )
    else:
        severity = Severity.ERROR
        summary = (
            f"{nodes} never joined the rendezvous, so no rank started: torchrun gave up "
            f"waiting for it after {fmt_s(waited)}"
        )
    return RuleOutcome(
        rule="rendezvous",
        findings=(
            Finding(
                id=NODES_MISSING,
                severity=severity,
                summary=summary,
                fix=fix_for(snap.nodes_missing, snap.run.command),
                evidence=tuple(
                    Evidence(f"no nodes/node-{node}/node.json in {snap.run.run_dir}")
                    for node in snap.nodes_missing
                ),
            ),
        ),
    )


def fix_for(nodes: Sequence[int], command: Sequence[str]) -> str:
    first = min(nodes)
    start = f"`{shlex.join(command_for_node(command, first))}`" if command else "`ddpdoctor run`"
    more = f" (and likewise on {named_ranks(nodes, 'node')})" if len(nodes) > 1 else ""
    return (
        f"Start the launcher of {named_ranks([first], 'node')} with the same options and run directory: "
        f"{start}{more}. The run directory must be on a filesystem every node shares. If that "
        "launcher is running, check that it reaches the rendezvous endpoint (address, port, "
        "firewall) and uses the same --rdzv-id. --join-timeout bounds the wait (torchrun's "
        "default is 600 s)."
    )


def command_for_node(command: Sequence[str], node: int) -> list[str]:
    """The recorded launcher command with its --node-rank set to `node`."""
    argv = list(command)
    for i, arg in enumerate(argv):
        if arg == "--node-rank" and i + 1 < len(argv):
            argv[i + 1] = str(node)
        elif arg.startswith("--node-rank="):
            argv[i] = f"--node-rank={node}"
    return argv
