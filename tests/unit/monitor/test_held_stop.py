"""A job ddpdoctor stopped for a mismatch or a hang: the ranks its stop ended are the stop's
effect, never "rank N died" (which told the user to look for an OOM kill or a crash)."""

from __future__ import annotations

from dataclasses import replace

from ddpdoctor.monitor.judge.diagnose import diagnose
from ddpdoctor.monitor.judge.rules import crash, mismatch
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from tests.unit.monitor.test_monitor_builders import NOW, coll, snap, view


def mismatched(failed_t: float):
    """Rank 0 in a barrier, rank 1 in a broadcast at #13, then rank 0 gone at `failed_t`."""
    r0 = view(0, RankState.WAITING, collective=coll("barrier", 13, 2.0), seq=12)
    r1 = view(1, RankState.WAITING, collective=coll("broadcast", 13, 2.0), seq=12)
    held = mismatch.detect(snap([r0, r1]))
    assert held is not None and held.verdict is Verdict.MISMATCH
    gone = replace(r0, state=RankState.GONE, alive=False, failed_t=failed_t)
    return held, snap([gone, r1])


def ids(diagnosis):
    return [(f.id, f.severity.value) for f in diagnosis.findings]


def test_a_rank_that_vanished_once_ddpdoctor_stopped_the_job_did_not_die():
    held, after = mismatched(failed_t=NOW + 1.0)
    out = diagnose(after, held=replace(held, stopped_t=NOW))
    assert out.verdict is Verdict.MISMATCH
    assert ("died", "error") not in ids(out)
    stop = next(f for f in out.findings if f.id == "crash.consequence")
    assert (
        stop.summary == "rank 0 failed as a consequence of the mismatch (ddpdoctor stopped the job)"
    )


def test_a_rank_that_died_before_the_stop_is_still_reported():
    held, after = mismatched(failed_t=NOW - 1.0)
    out = diagnose(after, held=replace(held, stopped_t=NOW))
    assert out.verdict is Verdict.MISMATCH
    assert ("died", "error") in ids(out)


def test_a_consequence_the_held_crash_named_is_not_named_again_as_the_stops():
    """Rank 1 crashed, rank 0 lost it (gloo: peer closed) and the crash said so; ddpdoctor then
    stopped the job. Rank 0 is the crash's consequence once, not also the stop's."""
    r1 = view(1, RankState.FAILED, alive=False, failed_t=NOW - 2.0, exit_code=1)
    r1 = replace(r1, error="InjectedCrash: injected crash")
    r0 = view(0, RankState.FAILED, alive=False, failed_t=NOW - 1.5, exit_code=1)
    r0 = replace(r0, error="RuntimeError: Connection closed by peer")
    held = crash.detect(snap([r0, r1]))
    assert held is not None and held.culprits == {1}
    out = diagnose(snap([r0, r1]), held=replace(held, stopped_t=NOW - 1.0))
    consequences = [f for f in out.findings if f.id == "crash.consequence"]
    assert [(f.ranks, f.summary) for f in consequences] == [
        ((0,), "rank 0 failed as a consequence of rank 1's failure")
    ]


def test_the_held_crashs_consequence_tells_what_the_rank_says_now():
    """At the stop rank 2 had only vanished; its own error was read after it. The held crash's
    consequence finding shows that error, not "vanished" (and rank 2 is not named twice)."""
    r1 = replace(
        view(1, RankState.FAILED, alive=False, failed_t=NOW - 2.0, exit_code=1),
        error="InjectedCrash: injected crash",
    )
    r2 = view(2, RankState.GONE, alive=False, failed_t=NOW - 1.5)
    held = crash.detect(snap([view(0), r1, r2]))
    assert held is not None and held.culprits == {1}
    told = next(f for f in held.findings if f.id == "crash.consequence")
    assert told.ranks == (2,) and "vanished" in told.evidence[0].text
    r2_later = replace(
        r2, state=RankState.FAILED, exit_code=1, error="RuntimeError: CUDA error: illegal access"
    )
    out = diagnose(snap([view(0), r1, r2_later]), held=replace(held, stopped_t=NOW - 1.0))
    consequences = [f for f in out.findings if f.id == "crash.consequence"]
    assert len(consequences) == 1 and consequences[0].ranks == (2,)
    assert "CUDA error: illegal access" in consequences[0].evidence[0].text
