"""`ddpdoctor explain` of PyTorch flight-recorder dumps (real ones, from plain torchrun jobs:
tests/fixtures/flight_recorder/torch-dumps) alone and with the job's logs, and of a torchrun
failure table cut before its Root Cause part (tests/fixtures/torchrun)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ddpdoctor import cli
from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.explain.engine import explain_files

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
DUMPS = FIXTURES / "flight_recorder" / "torch-dumps"
TORCHRUN = FIXTURES / "torchrun"


def errors(findings):
    return [f for f in findings if f.severity.value == "error"]


def test_a_hang_names_the_rank_that_never_reached_the_collective_and_its_number():
    (head,) = errors(explain_files([DUMPS / "hang"]))
    assert head.id == "fr.never_reached" and head.ranks == (1,)
    assert head.summary.startswith("rank 1 never reached all_reduce #6: rank 0 waits in it")
    assert "rank 1 left no dump" in head.summary
    texts = [e.text for e in head.evidence]
    assert any("rank 0 called it at:" in t and "train.py:100 train" in t for t in texts)


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("mismatch", "rank 0 called all_reduce #6 of float32[4]; rank 1 called broadcast #6"),
        ("size", "rank 0 called all_reduce #6 of float32[4]; rank 1 called all_reduce #6 of "
                 "float32[8]"),
        ("dtype", "rank 0 called all_reduce #6 of float32[4]; rank 1 called all_reduce #6 of "
                  "int32[4]"),
        ("mismatch-json", "rank 1 called broadcast #6 of float32[4]"),
    ],
)  # fmt: skip
def test_mismatches_name_both_sides_at_6(name, said):
    (head,) = errors(explain_files([DUMPS / name]))
    assert head.id == "fr.mismatch" and head.summary.startswith("Collective mismatch at #6: ")
    assert said in head.summary and head.ranks == (1,)
    assert "torch's analyzer at #6" in head.evidence[0].text


def test_a_subgroup_hang_names_the_group_and_the_member_that_left_no_dump():
    findings = explain_files([DUMPS / "subgroup"])
    (head,) = errors(findings)
    assert head.summary.startswith("rank 2 never reached all_reduce #3 of group experts")
    assert head.ranks == (2,) and len(findings) == 1  # the default group's silence adds nothing


def test_dumps_alone_of_an_exited_rank_say_what_they_can():
    dump = DUMPS / "exited-late" / "fr_trace_rank_0"  # the failed #6 recorded as retired
    (only,) = explain_files([dump])
    assert only.id == "fr.no_dump" and only.severity.value == "warning" and only.ranks == (1,)


@pytest.mark.parametrize(
    ("name", "headline"),
    [
        ("exited", "rank 1 never reached all_reduce #6: rank 0 waits in it"),
        # rank 0's dump has #6 retired (failed): its log says it failed there
        ("exited-late", "rank 1 never reached all_reduce #6: rank 0 failed in it"),
    ],
)
def test_dumps_and_logs_in_one_directory_tell_one_story(name, headline):
    findings = explain_files([DUMPS / name])  # rank 0's dump + torchrun's output
    (head,) = errors(findings)
    assert head.id == "fr.never_reached" and head.ranks == (1,)
    assert head.summary.startswith(headline)
    rest = {f.id: f for f in findings[1:]}
    # torchrun's table names rank 0, the rank that waited: a consequence, told as such
    assert rest["torchrun.failed"].severity.value == "warning"
    assert "a consequence: rank 1 never came" in rest["torchrun.failed"].summary


def test_explain_json_and_exit_codes(capsys, tmp_path):
    code = cli.main(["explain", "--json", str(DUMPS / "hang")])
    out, err = capsys.readouterr()
    assert code == ExitCode.PROBLEMS and err == ""
    (finding,) = json.loads(out)["findings"]
    assert (finding["id"], finding["ranks"]) == ("fr.never_reached", [1])
    bad = tmp_path / "fr_trace_rank_0"
    bad.write_bytes(b"\x80\x04not a pickle at all")
    code = cli.main(["explain", str(bad)])
    out, err = capsys.readouterr()
    assert code == ExitCode.USAGE and out == ""
    assert err.startswith("ddpdoctor: error: ") and err.count("\n") == 1


def test_a_dump_given_twice_in_two_forms_counts_once(tmp_path):
    for path in (DUMPS / "mismatch").iterdir():
        shutil.copy(path, tmp_path / path.name)
    for path in (DUMPS / "mismatch-json").iterdir():
        shutil.copy(path, tmp_path / path.name)
    (head,) = errors(explain_files([tmp_path]))
    assert head.id == "fr.mismatch"


def test_a_torchrun_table_cut_before_root_cause_names_rank_exit_error_file_and_user_frame():
    (head,) = errors(explain_files([TORCHRUN / "torchrun-truncated.log"]))
    assert head.id == "torchrun.failed" and head.ranks == (1,)
    assert head.summary.startswith("Rank 1 (pid 24389, on localhost) exited with code 1")
    assert "its traceback ends in /tmp/pm/bug.py:16 in main: dist.barrier()" in head.summary
    assert "error file /tmp/torchelastic_" in head.summary and "/attempt_0/1/error.json" in (
        head.summary
    )
    assert "cut before its Root Cause part" in head.summary


def test_the_whole_table_still_names_its_root_cause():
    findings = explain_files([TORCHRUN / "torchrun-full.log"])
    head = next(f for f in findings if f.id == "torchrun.failed")
    assert head.ranks == (0,) and "the first failure torchrun observed" in head.summary
    assert "bug.py:13 in main: raise RuntimeError" in head.summary


def test_with_torchruns_own_line_kept_a_cut_table_still_names_the_first_failure(tmp_path):
    whole = (TORCHRUN / "torchrun-full.log").read_text()
    cut = tmp_path / "cut.log"
    cut.write_text(whole[: whole.index("Root Cause (first observed failure)")])
    findings = explain_files([cut])
    head = next(f for f in findings if f.id == "torchrun.failed")
    assert head.ranks == (0,) and "the first failure torchrun observed" in head.summary


def test_a_run_directory_leaves_the_dumps_its_monitor_collected_out(tmp_path):
    """The monitor asks for dumps whenever a rank waits a while: in a healthy run, rank 1 in a
    barrier while rank 0 evaluates. Read after the run they would say "rank 0 never reached
    barrier #46" of a job that ended healthy, so `explain RUN_DIR` leaves them out (the run's
    diagnosis.json says what they meant); given by name they are read."""
    run = tmp_path / "run"
    (run / "logs" / "vm").mkdir(parents=True)
    (run / "logs" / "vm" / "torchrun.log").write_text("starting\n")
    (run / "run.json").write_text("{}")
    recorded = FIXTURES / "flight_recorder" / "mismatch-gloo"
    (run / "flight_recorder").mkdir()
    for dump in recorded.glob("rank-*.json"):
        (run / "flight_recorder" / dump.name).write_bytes(dump.read_bytes())
    assert errors(explain_files([run])) == []
    assert errors(explain_files([run / "flight_recorder"]))
