"""init_process_group(world_size=3) under 2 ranks: a MISMATCH once the ranks have waited in it."""

from __future__ import annotations

from ddpdoctor.monitor.judge.diagnose import diagnose
from ddpdoctor.monitor.judge.rules import world_size
from ddpdoctor.monitor.model.snapshot import RankState, Verdict
from tests.unit.monitor.test_monitor_builders import NOW, snap, view

MESSAGE = "init_process_group(world_size=3) but the launcher started 2 ranks (WORLD_SIZE=2)"


def in_init(rank: int, since: float, **kw):
    kw.setdefault("state", RankState.STARTING)
    state = kw.pop("state")
    return view(rank, state, phase="init", step=None, seq=0, collectives_done=0,
                last_progress_t=since, warnings=((world_size.CODE, MESSAGE),), **kw)  # fmt: skip


def test_waiting_past_the_threshold_is_a_mismatch_naming_both_sizes():
    ranks = [in_init(0, NOW - 12.0), in_init(1, NOW - 12.0)]
    diagnosis = diagnose(snap(ranks))
    assert diagnosis.verdict is Verdict.MISMATCH
    finding = diagnosis.findings[0]
    assert finding.id == "init.world_size_mismatch" and finding.ranks == (0, 1)
    assert finding.summary.startswith(
        "waiting for ranks that will never come: world_size=3 but 2 ranks launched"
    )
    assert "Drop world_size=" in finding.fix
    # the runtime's warning is not listed a second time
    assert [f.id for f in diagnosis.findings].count("init.world_size_mismatch") == 1


def test_not_before_the_threshold_and_not_once_training():
    assert world_size.detect(snap([in_init(0, NOW - 2.0), in_init(1, NOW - 2.0)])) is None
    trained = view(0, warnings=((world_size.CODE, MESSAGE),), last_progress_t=NOW - 60.0)
    assert world_size.detect(snap([trained])) is None


def test_ranks_stopped_after_the_wait_keep_the_verdict():
    failed = dict(state=RankState.FAILED, failed_t=NOW - 1.0, exit_code=-15, alive=False)
    ranks = [in_init(0, NOW - 15.0, **failed), in_init(1, NOW - 15.0, **failed)]
    assert diagnose(snap(ranks)).verdict is Verdict.MISMATCH
