"""Words for where a rank is: phase, step, last event, collective, stack (shared by the rules)."""

from __future__ import annotations

from collections.abc import Sequence

from ddpdoctor.monitor.judge.rules import fmt_s
from ddpdoctor.monitor.model.snapshot import RankState, RankView, StackGroup

_STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGKILL")


def stack_of(rank: int, stacks: Sequence[StackGroup]) -> StackGroup | None:
    for group in stacks:
        if rank in group.ranks:
            return group
    return None


def innermost_frame(group: StackGroup) -> str | None:
    """The innermost Python frame of a (folded) stack: what the rank is executing."""
    frames = [f for f in group.frames if f and not f.startswith(("…", "..."))]
    python = [f for f in frames if ".py:" in f]
    chosen = python or frames
    return chosen[-1] if chosen else None


def position(view: RankView) -> str:
    """ "in phase train at step 10" / "waits in barrier #40 (9.1 s), in phase eval" """
    place = []
    if view.phase:
        place.append(f"in phase {view.phase}")
    if view.step is not None:
        place.append(f"at step {view.step}")
    if view.collective is not None and not view.state.finished:
        text = f"waits in {view.collective.describe()} ({fmt_s(view.collective.waiting_s)})"
        return text + (", " + " ".join(place) if place else "")
    return "is " + " ".join(place) if place else "is running"


def ending(view: RankView) -> str | None:
    """How a finished rank ended, in words (None while it runs)."""
    if view.state is RankState.DONE:
        return "exited normally (code 0)"
    if view.state is RankState.FAILED and view.error:
        return f"failed: {view.error}"
    if view.exit_signal:
        return f"was {'stopped' if view.exit_signal in _STOP_SIGNALS else 'ended'} by {view.exit_signal}"
    if view.exit_code is not None:
        return f"exited with code {view.exit_code}"
    if view.state is RankState.GONE:
        return "vanished without an exit event"
    return None


def where_is(view: RankView, stacks: Sequence[StackGroup] = ()) -> str:
    """ "it is in phase train at step 10, last event fault hang; stack: job.py:120 _inject_hang" """
    if view.state is RankState.STARTING and view.last_event is None:
        return (
            "it has written no events yet (not started, or stuck before ddpdoctor's runtime loaded)"
        )
    if view.state is RankState.DONE:
        step = f" at step {view.step}" if view.step is not None else ""
        return f"it exited normally (code 0){step}, before reaching it"
    text = f"it {position(view)}"
    if view.last_event:
        text += f", last event {view.last_event}"
    end = ending(view)
    if end:
        text += f"; then it {end}"
    group = stack_of(view.rank, stacks)
    if group is not None:
        frame = innermost_frame(group)
        if frame:
            text += f"; stack: {frame}"
    return text
