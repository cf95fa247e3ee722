"""A diagnosed snapshot as text: the verdict, culprits and where they are, findings with fixes,
grouped stacks, and a one-line status for logs. Rich Text, so a terminal gets colour and a pipe
or a CI log gets plain lines."""

from __future__ import annotations

from collections import Counter

from rich.text import Text

from ddpdoctor.findings import Finding, Severity
from ddpdoctor.monitor.judge.rules import fmt_s
from ddpdoctor.monitor.model.snapshot import (
    RankState,
    RankView,
    Snapshot,
    StackGroup,
    Verdict,
    WaitView,
)
from ddpdoctor.protocol.verdicts import ActivityState
from ddpdoctor.rank_ranges import named_ranks

VERDICT_STYLE = {
    Verdict.RUNNING: "cyan",
    Verdict.HEALTHY: "bold green",
    Verdict.HANG: "bold red",
    Verdict.MISMATCH: "bold red",
    Verdict.CRASH: "bold red",
    Verdict.NOT_STARTED: "bold red",
    Verdict.INTERRUPTED: "bold yellow",
    Verdict.NOT_DISTRIBUTED: "bold",
    Verdict.NOT_INSTRUMENTED: "bold yellow",
}
# Verdicts whose headline is the reason (a run.* finding), not culprits.
ENDED_WITHOUT_A_PROBLEM_FOUND = (
    Verdict.NOT_STARTED,
    Verdict.INTERRUPTED,
    Verdict.NOT_DISTRIBUTED,
    Verdict.NOT_INSTRUMENTED,
)
SEVERITY_SYMBOL = {Severity.ERROR: "fail", Severity.WARNING: "warn", Severity.INFO: "skip"}
SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "dim"}
STATE_STYLE = {
    RankState.WAITING: "yellow",
    RankState.STALLED: "bold red",
    RankState.FAILED: "red",
    RankState.GONE: "red",
    RankState.DONE: "green",
}
MAX_RANK_LINES = 16
MAX_EVIDENCE = 8
MAX_FRAMES = 14


def headline_finding(snap: Snapshot) -> Finding | None:
    """The finding the verdict line states as its reason (an ending without a problem found:
    not started, interrupted, not distributed, not instrumented), if any."""
    if snap.verdict not in ENDED_WITHOUT_A_PROBLEM_FOUND:
        return None
    return next((f for f in snap.findings if f.id.startswith(("run.", "node."))), None)


def verdict_line(snap: Snapshot) -> Text:
    """ "HANG: culprit rank 1 (detected 5.3 s after it started)" """
    if snap.never_started and snap.nodes_missing:
        text = Text("NOT STARTED", style="bold red")
        text.append(f": {named_ranks(snap.nodes_missing, 'node')} never joined the rendezvous")
        return text
    text = Text(snap.verdict.value.replace("_", " ").upper(), style=VERDICT_STYLE[snap.verdict])
    if snap.verdict in ENDED_WITHOUT_A_PROBLEM_FOUND:
        reason = headline_finding(snap)
        if reason is not None:
            text.append(f": {reason.summary}")
        return text
    if snap.verdict.is_problem:
        if snap.culprits:
            text.append(f": culprit {named_ranks(snap.culprits)}")
            if snap.findings and snap.findings[0].id == "node.lost":  # "host h2 lost: ..."
                text.append(f" ({snap.findings[0].summary.partition(':')[0]})")
        elif snap.findings and snap.findings[0].id.startswith("run."):
            text.append(f": {snap.findings[0].summary}")  # no rank to blame: the reason
        if snap.detected_after_s is not None:
            text.append(f" (detected {fmt_s(snap.detected_after_s)} after it started)")
    elif snap.verdict is Verdict.HEALTHY:
        text.append(f": all {len(snap.ranks)} ranks finished")
    return text


WAIT_STYLE = {"info": "cyan", "warning": "yellow", "error": "bold red"}


def busy_wait(snap: Snapshot) -> WaitView | None:
    """The longest current wait for busy ranks (a wait, not a hang), if any."""
    return next((w for w in snap.waits if w.busy), None)


def wait_line(wait: WaitView) -> str:
    """ "ranks 1-7 wait 20 s for rank 0, busy in train.py:88 evaluate (CPU 100%)", with the
    process group's countdown once it is a warning."""
    text = wait.summary
    if wait.busy and wait.severity in ("warning", "error") and wait.timeout_in_s is not None:
        text += f"; the process group times out in {fmt_s(wait.timeout_in_s)}"
    return text


def status_line(snap: Snapshot) -> str:
    """One line for a log every few seconds: verdict, steps, step time, states."""
    parts = [snap.verdict.value]
    if snap.elapsed_s is not None:
        parts.append(f"{snap.elapsed_s:.0f} s")
    if snap.attempts is not None:  # a job its launcher restarts: which attempt runs
        parts.append(snap.attempts.label())
    steps = [v.step for v in snap.ranks if v.step is not None]
    if steps:
        total = next((v.total_steps for v in snap.ranks if v.total_steps), None)
        lo, hi = min(steps), max(steps)
        step = f"step {lo}" if lo == hi else f"steps {lo}-{hi}"
        parts.append(step + (f"/{total}" if total else ""))
    times = [v.step_time_s for v in snap.ranks if v.step_time_s is not None]
    if times:
        parts.append(f"{sorted(times)[len(times) // 2]:.3f} s/step")
    losses = [v.loss for v in snap.ranks if v.loss is not None]
    if losses:
        parts.append(f"loss {sum(losses) / len(losses):.4g}")
    counts = Counter(v.state.value for v in snap.ranks)
    if snap.ranks:
        parts.append(", ".join(f"{n} {state}" for state, n in sorted(counts.items())))
    else:  # a user's command: its processes become ranks when they join a process group
        parts.append("no rank has joined a process group yet")
    if snap.nodes_missing:
        parts.append(f"waiting for {named_ranks(snap.nodes_missing, 'node')} to join")
    waiting = [v for v in snap.ranks if v.state is RankState.WAITING and v.collective]
    wait = busy_wait(snap)
    if wait is not None:
        parts.append(wait_line(wait))
    elif waiting:
        view = max(waiting, key=lambda v: v.collective.waiting_s if v.collective else 0)
        assert view.collective is not None
        on = f" on {named_ranks(view.waiting_on)}" if view.waiting_on else ""
        parts.append(
            f"rank {view.rank} waits in {view.collective.op} #{view.collective.seq}"
            f" {fmt_s(view.collective.waiting_s)}{on}"
        )
    return " · ".join(parts)


def rank_line(view: RankView) -> Text:
    text = Text(f"rank {view.rank:<4} ")
    text.append(f"{view.state.value:<14}", style=STATE_STYLE.get(view.state, ""))
    bits = []
    if view.host:
        bits.append(f"{view.host}:{view.pid}" if view.pid else view.host)
        if view.actor:
            bits[-1] += f" ({view.actor})"
    if view.restarts:
        bits.append(f"restarted {view.restarts}×")
    if view.phase:
        bits.append(f"phase {view.phase}")
    if view.step is not None:
        bits.append(f"step {view.step}")
    if view.collective is not None:
        bits.append(f"in {view.collective.describe()} {fmt_s(view.collective.waiting_s)}")
    if view.waiting_on:
        bits.append(f"waits on {named_ranks(view.waiting_on)}")
    if (
        view.activity is not None
        and view.activity.state is not ActivityState.IN_COLLECTIVE
        and not view.state.finished
    ):
        bits.append(view.activity.describe())
    if view.error:
        bits.append(view.error if len(view.error) <= 160 else view.error[:157] + "…")
    elif view.exit_signal and view.state.finished:
        bits.append(view.exit_signal)
    elif view.exit_code not in (None, 0):
        bits.append(f"exit {view.exit_code}")
    if view.last_event and view.state not in (RankState.DONE,):
        bits.append(f"last event {view.last_event}")
    text.append(" · ".join(bits))
    return text


def finding_lines(finding: Finding, symbols: dict[str, str]) -> list[Text]:
    head = Text("  ")
    head.append(symbols[SEVERITY_SYMBOL[finding.severity]], style=SEVERITY_STYLE[finding.severity])
    head.append(f" {finding.id}: ", style="bold")
    head.append(finding.summary)
    lines = [head]
    for ev in finding.evidence[:MAX_EVIDENCE]:
        where = (
            f"{ev.file}:{ev.line}: " if ev.file and ev.line else f"{ev.file}: " if ev.file else ""
        )
        lines.append(Text(f"      {where}{ev.text}", style="dim"))
    if len(finding.evidence) > MAX_EVIDENCE:
        lines.append(Text(f"      … {len(finding.evidence) - MAX_EVIDENCE} more", style="dim"))
    if finding.fix and finding.severity is not Severity.INFO:
        fix = Text("      fix: ", style="bold")
        fix.append(finding.fix)
        lines.append(fix)
    return lines


def stack_lines(stacks: tuple[StackGroup, ...], culprits: frozenset[int]) -> list[Text]:
    if not stacks:
        return []
    lines = [Text("Stacks (py-spy, innermost last):", style="bold")]
    for group in stacks:
        odd = " — culprit" if culprits and set(group.ranks) & culprits else ""
        title = Text(f"  {named_ranks(group.ranks)} ({len(group.ranks)}){odd}")
        if odd:
            title.stylize("bold red")
        if group.thread:
            title.append(f" thread {group.thread}", style="dim")
        lines.append(title)
        frames = list(group.frames)
        if len(frames) > MAX_FRAMES:
            lines.append(Text(f"      … {len(frames) - MAX_FRAMES} outer frames", style="dim"))
            frames = frames[-MAX_FRAMES:]
        lines.extend(Text(f"      {frame}") for frame in frames)
    return lines


def diagnosis_lines(
    snap: Snapshot, symbols: dict[str, str], *, with_stacks: bool = True
) -> list[Text]:
    """The whole diagnosis: verdict, the ranks that matter, findings with fixes, stacks."""
    lines = [verdict_line(snap)]
    notable = [
        v
        for v in snap.ranks
        if v.rank in snap.culprits or v.state not in (RankState.RUNNING, RankState.DONE)
    ]
    if snap.verdict.is_problem and notable:
        lines.append(Text("Ranks:", style="bold"))
        for view in notable[:MAX_RANK_LINES]:
            line = Text("  ")
            line.append_text(rank_line(view))
            if view.rank in snap.culprits:
                line.append("  ← culprit", style="bold red")
            lines.append(line)
        if len(notable) > MAX_RANK_LINES:
            lines.append(Text(f"  … {len(notable) - MAX_RANK_LINES} more ranks", style="dim"))
    reason = headline_finding(snap)
    if reason is not None:  # said in the headline: its evidence and fix only
        lines.extend(finding_lines(reason, symbols)[1:])
    others = [f for f in snap.findings if f is not reason]
    if others:
        lines.append(Text("Findings:", style="bold"))
        for finding in others:
            lines.extend(finding_lines(finding, symbols))
    if with_stacks:
        lines.extend(stack_lines(snap.stacks, snap.culprits))
    if snap.stack_status and (snap.verdict.is_problem or snap.stacks):
        lines.append(Text(f"stacks: {snap.stack_status}", style="dim"))
    return lines
