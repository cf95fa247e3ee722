"""The script checkup's findings cited on the run-time findings whose symptom they explain
(ddpdoctor.monitor.judge.script_citations), and read from the run directory's doctor.json
(ddpdoctor.monitor.follow.checkup): on hand-built snapshots, real checkup reports and a Monitor."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.checks.scriptcheck import script_results
from ddpdoctor.checks.scriptcheck.rulebase import RULES
from ddpdoctor.explain.catalog import DESCRIPTIONS
from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor import Monitor
from ddpdoctor.monitor.follow.checkup import CheckupReader, notes_of
from ddpdoctor.monitor.judge import script_citations
from ddpdoctor.monitor.judge.diagnose import diagnose
from ddpdoctor.monitor.model.snapshot import (
    Activity,
    CheckupNote,
    LogLine,
    RankState,
    Snapshot,
    StackGroup,
    Verdict,
)
from ddpdoctor.protocol.verdicts import ActivityState
from tests.unit.monitor.test_monitor_builders import NOW, snap, view, waiting
from tests.unit.monitor.test_monitor_monitor import Clock, Writer, new_run, train

GUARD = CheckupNote(
    "script.collective_under_rank_guard",
    "train.py",
    42,
    "barrier() runs only under the rank guard of line 40: a collective needs every rank",
    "dist.barrier()",
)
SET_EPOCH = CheckupNote(
    "script.set_epoch_missing", "train.py", 30, "no set_epoch: the same order", "for x in loader:"
)
PORT = CheckupNote(
    "script.master_port_hardcoded",
    "/home/u/job/train.py",
    8,
    "MASTER_PORT is fixed to '12355' in the code",
    'os.environ["MASTER_PORT"] = "12355"',
)
UNUSED = CheckupNote(
    "script.find_unused_parameters",
    "train.py",
    51,
    "find_unused_parameters=True",
    "DDP(model, find_unused_parameters=True)",
)


def at(where: str | None, state: ActivityState = ActivityState.IN_COLLECTIVE) -> Activity:
    return Activity(state=state, cpu_pct=0.0, where=where, since_s=6.0)


def blocked(where: str | None) -> Activity:
    return at(where, ActivityState.BLOCKED)


def hang_snap(waiter_where: str | None, culprit_where: str | None, **kw) -> Snapshot:
    """Rank 0 waits in barrier #41 past the threshold; rank 1 never reached it, blocked."""
    ranks = [
        waiting(0, 41, 8.0, op="barrier", activity=at(waiter_where) if waiter_where else None),
        view(1, seq=40, activity=blocked(culprit_where) if culprit_where else None),
    ]
    return snap(ranks, **kw)


def cited(finding: Finding) -> list[Evidence]:
    return [e for e in finding.evidence if e.text.startswith(script_citations.TAG)]


def headline(s: Snapshot, notes=(GUARD,)) -> Finding:
    return diagnose(replace(s, checkup=tuple(notes))).findings[0]


def test_a_hang_at_the_flagged_line_cites_the_checkup_finding_with_file_and_line():
    s = hang_snap("train.py:42 main", "train.py:55 main")
    before = diagnose(s)
    after = diagnose(replace(s, checkup=(GUARD, SET_EPOCH)))
    assert before.verdict is after.verdict is Verdict.HANG
    assert after.culprits == before.culprits == {1} and after.confirmed == before.confirmed
    finding = after.findings[0]
    assert finding.id == "hang" and finding.severity is Severity.ERROR
    assert finding.summary == (
        before.findings[0].summary + " (the script checkup flagged train.py:42 before the launch)"
    )
    [evidence] = cited(finding)
    assert (evidence.file, evidence.line) == ("train.py", 42)
    assert evidence.text == (
        "the script checkup flagged this before the launch: `dist.barrier()` — "
        "barrier() runs only under the rank guard of line 40: a collective needs every rank "
        "[script.collective_under_rank_guard]"
    )
    assert finding.evidence[: len(before.findings[0].evidence)] == before.findings[0].evidence


def test_a_hang_elsewhere_in_the_checked_script_cites_nothing():
    s = hang_snap("train.py:60 main", "train.py:55 main")
    assert diagnose(replace(s, checkup=(GUARD,))).findings == diagnose(s).findings


def test_a_rank_anywhere_in_the_guarded_body_is_at_the_flagged_call():
    """A DDP forward flagged at line 42, the backward's all-reduce waiting at line 44 of the same
    `if rank == 0:` body (lines 41-44)."""
    forward = replace(GUARD, block=(41, 44))
    inside = headline(hang_snap("train.py:44 main", "train.py:60 main"), notes=(forward,))
    assert [(e.file, e.line) for e in cited(inside)] == [("train.py", 42)]
    after = hang_snap("train.py:45 main", "train.py:60 main")
    assert not cited(headline(after, notes=(forward,)))
    elsewhere = headline(hang_snap("other.py:44 main", None), notes=(forward,))
    assert "may explain it" in elsewhere.summary  # line 44 of another file is not in the body


def test_the_line_is_found_in_a_captured_stack_too():
    stack = StackGroup(
        ranks=(0,),
        frames=(
            "… 6 library frames (runpy)",
            "train.py:42 main",
            "distributed_c10d.py:4812 barrier",
        ),
    )
    s = hang_snap(None, None, stacks=(stack,))
    assert [(e.file, e.line) for e in cited(headline(s))] == [("train.py", 42)]


def test_a_hang_with_no_known_place_may_be_explained_by_the_one_rank_guard_finding():
    finding = headline(hang_snap(None, None))
    assert finding.summary.endswith("(train.py:42, flagged by the script checkup, may explain it)")
    [evidence] = cited(finding)
    assert evidence.text.startswith(
        "the script checkup flagged a line before the launch that may explain this: `"
    )


def test_with_two_rank_guard_findings_and_no_place_nothing_is_guessed():
    other = replace(GUARD, line=77)
    assert not cited(headline(hang_snap(None, None), notes=(GUARD, other)))


def test_a_place_only_in_another_file_still_allows_may_explain():
    finding = headline(hang_snap("helpers.py:9 sync", None))
    assert "may explain it" in finding.summary


def test_a_mismatch_cites_the_flagged_line_and_never_guesses():
    ranks = [
        waiting(0, 41, 2.0, op="barrier", activity=at("train.py:42 main")),
        waiting(1, 41, 2.0, op="all_reduce", activity=at("train.py:50 train_step")),
    ]
    s = snap(ranks)
    finding = headline(s)
    assert finding.id == "mismatch"
    assert [(e.file, e.line) for e in cited(finding)] == [("train.py", 42)]
    unplaced = snap([waiting(0, 41, 2.0, op="barrier"), waiting(1, 41, 2.0, op="all_reduce")])
    assert headline(unplaced).id == "mismatch" and not cited(headline(unplaced))


def test_the_set_epoch_warning_cites_the_checkups_set_epoch_finding():
    message = "epoch 1 started without DistributedSampler.set_epoch(); shuffling repeats"
    ranks = [view(r, warnings=(("sampler.set_epoch_missing", message),)) for r in (0, 1)]
    out = diagnose(replace(snap(ranks), checkup=(GUARD, SET_EPOCH)))
    assert out.verdict is Verdict.RUNNING
    [finding] = [f for f in out.findings if f.id == "sampler.set_epoch_missing"]
    assert finding.severity is Severity.WARNING
    assert "(the script checkup flagged train.py:30 before the launch)" in finding.summary
    assert [(e.file, e.line) for e in cited(finding)] == [("train.py", 30)]


def test_a_crash_on_address_in_use_cites_the_hardcoded_port():
    line = LogLine(
        "rank 0 stderr",
        "torch.distributed.DistNetworkError: ... code: -98, name: EADDRINUSE",
        0,
        "error",
        finding_id="c10d.port_in_use",
    )
    ranks = [
        view(
            0,
            RankState.FAILED,
            error="DistNetworkError: address already in use",
            failed_t=NOW - 1,
            error_lines=(line,),
        ),
        view(1),
    ]
    logged = Finding("c10d.port_in_use", Severity.ERROR, "port 12355 is taken", "pick another")
    out = diagnose(replace(snap(ranks), checkup=(PORT, GUARD)), extra_findings=[logged])
    assert out.verdict is Verdict.CRASH
    crash = out.findings[0]
    assert crash.id == "crash" and [(e.file, e.line) for e in cited(crash)] == [
        ("/home/u/job/train.py", 8)
    ]
    [port] = [f for f in out.findings if f.id == "c10d.port_in_use"]
    assert port.summary == (
        "port 12355 is taken (the script checkup flagged /home/u/job/train.py:8 before the launch)"
    )


def test_a_crash_of_another_kind_cites_nothing():
    ranks = [view(0, RankState.FAILED, error="ValueError: bad batch", failed_t=NOW - 1), view(1)]
    out = diagnose(replace(snap(ranks), checkup=(PORT, GUARD, UNUSED)))
    assert out.verdict is Verdict.CRASH and not any(cited(f) for f in out.findings)


def test_the_unused_parameters_error_cites_find_unused_parameters():
    error = Finding("ddp.unused_parameters", Severity.ERROR, "parameters got no gradient", "fix")
    [finding] = script_citations.annotate([error], replace(snap([view(0)]), checkup=(UNUSED,)))
    assert [(e.file, e.line) for e in cited(finding)] == [("train.py", 51)]


def test_citing_is_idempotent_and_nothing_without_a_checkup():
    s = replace(hang_snap("train.py:42 main", None), checkup=(GUARD,))
    once = diagnose(s).findings
    assert script_citations.annotate(once, s) == once
    assert script_citations.annotate(once, replace(s, checkup=())) == once


def test_the_table_names_real_rules_and_real_findings():
    checkup_rules = {spec.id for spec in RULES}
    monitor_ids = {
        "hang",
        "mismatch",
        "sampler.set_epoch_missing",
        "init.world_size_mismatch",
        "spmd.contract_mismatch",
    }
    for finding_id, cites in script_citations.TABLE.items():
        assert finding_id in monitor_ids or finding_id in DESCRIPTIONS, finding_id
        assert cites.rules and set(cites.rules) <= checkup_rules, finding_id


# -- reading doctor.json --------------------------------------------------------------------

JOB = """\
import os
import torch.distributed as dist
os.environ["MASTER_PORT"] = "12355"
dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    dist.barrier()
dist.destroy_process_group()
"""


def report_of(path: str) -> dict:
    return DoctorReport.build(script_results([path]), elapsed_s=0.1).to_json()


def test_every_finding_of_a_real_checkup_report_is_read_with_its_line(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    notes = notes_of(report_of(str(job)))
    assert [(n.rule, n.line, n.text) for n in notes] == [
        ("script.collective_under_rank_guard", 7, "dist.barrier()"),
        # an info note of a script with problems is in doctor.json too (facts.notes)
        ("script.master_port_hardcoded", 3, 'os.environ["MASTER_PORT"] = "12355"'),
    ]
    assert all(n.path == str(job) for n in notes)
    assert notes[0].block == (7, 7) and notes[1].block is None
    assert "hangs at this line" in notes[0].summary


@pytest.mark.parametrize("doc", [None, [], {"results": "x"}, {"results": [{"group": "script"}]}])
def test_a_report_without_script_findings_gives_none(doc):
    assert notes_of(doc) == []


def test_the_reader_reads_each_report_once_as_it_appears_on_any_node(tmp_path):
    run = new_run(tmp_path)
    job = tmp_path / "job.py"
    job.write_text(JOB)
    reader = CheckupReader(run)
    assert reader.refresh() == ()
    node = run.nodes_dir / "node-1"
    node.mkdir(parents=True)
    (node / "doctor.json").write_text(json.dumps(report_of(str(job))))
    assert len(reader.refresh()) == 2
    run.doctor_json.write_text("{not json")  # a broken report is read once, and adds nothing
    assert len(reader.refresh()) == 2
    (node / "doctor.json").write_text("{}")  # read once: never again
    assert len(reader.refresh()) == 2


def test_the_monitor_cites_a_doctor_json_written_after_it_started(tmp_path):
    run, clock = new_run(tmp_path), Clock()
    w = Writer(run, clock)
    monitor = Monitor(run, clock=clock, capture_stacks=False, explain_logs=False)
    w.start()
    seq = train(w, clock, 4) + 1
    assert monitor.poll().checkup == ()
    job = tmp_path / "job.py"
    job.write_text(JOB)
    run.doctor_json.write_text(json.dumps(report_of(str(job))))
    since = clock.t
    w.ev(0, "collective_start", op="barrier", seq=seq, group="default", shapes=[], dtypes=[])
    for _ in range(16):  # rank 0 waits at job.py:7, rank 1 is blocked at job.py:8
        clock.t += 0.5
        open_ = {"op": "barrier", "seq": seq, "group": "default", "since_t": since}
        w.ev(0, "heartbeat", step=4, open=open_, cpu_s=1.0, where="job.py:7 <module>")
        w.ev(1, "heartbeat", step=4, open=None, cpu_s=1.0, where="job.py:8 <module>")
        final = monitor.poll()
    assert [n.line for n in final.checkup] == [3, 7]
    assert final.verdict is Verdict.HANG and final.culprits == {1}
    assert final.findings[0].summary.endswith(
        f"(the script checkup flagged {job}:7 before the launch)"
    )
    written = json.loads(run.diagnosis_json.read_text())
    [evidence] = [e for e in written["findings"][0]["evidence"] if e["file"] == str(job)]
    assert evidence["line"] == 7 and "[script.collective_under_rank_guard]" in evidence["text"]
