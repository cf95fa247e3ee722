"""benchmarks/false_alarms.py's bookkeeping: what counts as a false alarm, what counts as a right
detection, the side-by-side summary, and its command line (no job is started here)."""

from __future__ import annotations

import sys

from tests.procs import PYTHON, REPO, load_script, run

bench = load_script("benchmarks/false_alarms.py")

HEALTHY = bench.Job("recipe", ("--", "recipe.py"))
FAULTY = bench.Job("blocked", ("--", "blocked.py"), frozenset({"hang"}), (0,))


def outcome(job, verdict, *, culprits=(), loud=(), stopped=None, rc=0, detected=None):
    return bench.Outcome(job, rc, verdict, culprits, loud, stopped, detected, 10.0)


def test_a_healthy_job_is_a_false_alarm_on_any_alarm_warning_stop_or_failed_exit():
    assert not outcome(HEALTHY, "healthy").false_alarm
    assert outcome(HEALTHY, "hang", culprits=(0,), rc=1, stopped="hang").false_alarm
    assert outcome(HEALTHY, "healthy", loud=("sampler.uneven_batches",)).false_alarm
    assert outcome(HEALTHY, "healthy", stopped="hang").false_alarm


def test_a_healthy_job_killed_at_its_timeout_is_told_apart_and_fails_the_run(capsys):
    """No verdict at all (a job whose ranks never started, one ddpdoctor slowed): not an alarm
    ddpdoctor raised, not a pass either."""
    late = outcome(HEALTHY, None, rc=None)  # killed after the run timeout
    assert late.timed_out and not late.false_alarm
    assert any("timed out (no verdict): recipe" in line for line in bench.summary([late], []))
    bench._print_run(late)
    assert "TIMED OUT" in capsys.readouterr().out


def test_a_detection_is_right_only_with_the_expected_verdict_and_culprits():
    assert outcome(FAULTY, "hang", culprits=(0,), rc=1).right
    assert not outcome(FAULTY, "hang", culprits=(1,), rc=1).right
    assert not outcome(FAULTY, "mismatch", culprits=(0,), rc=1).right


def test_summary_puts_false_alarms_beside_detection():
    lines = bench.summary(
        [outcome(HEALTHY, "healthy"), outcome(HEALTHY, "hang", rc=1, stopped="hang")],
        [
            outcome(FAULTY, "hang", culprits=(0,), rc=1, detected=5.0),
            outcome(FAULTY, "hang", culprits=(0,), rc=1, detected=7.0),
            outcome(FAULTY, "hang", culprits=(1,), rc=1, detected=6.0),
        ],
    )
    text = "\n".join(lines)
    assert lines[0].startswith("healthy set (false alarms)") and "faulty set" in lines[0]
    assert "false alarms: 1/2" in text and "alarmed: recipe" in text
    assert "verdict + culprit right: 2/3" in text and "wrong: blocked" in text
    assert "median 6.0 s (min 5.0, max 7.0)" in text


def test_the_sets_come_from_the_corpus_manifest_and_the_planted_faults():
    healthy = {j.name for j in bench.healthy_jobs()}
    faulty = {j.name: j for j in bench.faulty_jobs()}
    assert {"rank0-download-barrier", "rank0-eval-checkpoint"} <= healthy
    assert faulty["rank0-blocked-on-queue"].culprits == (0,)
    assert {f"inject-{k}" for k in ("hang", "crash", "mismatch", "exit")} <= set(faulty)
    assert {p.stem for p in (REPO / "sample_jobs").glob("*.py")} >= {
        n.removeprefix("sample-") for n in faulty if n.startswith("sample-")
    }


def test_an_only_that_matches_nothing_is_a_usage_error():
    r = run([PYTHON, "benchmarks/false_alarms.py", "--only", "no-such-job"], timeout=60, cwd=REPO)
    assert r.returncode == 2 and "no job matches --only no-such-job" in r.stderr


def test_a_job_torch_aborted_at_exit_counts_apart_and_only_if_ddpdoctor_said_just_that(tmp_path):
    """Every rank recorded exit 0, then torch's teardown aborted one (the job exits 1 under plain
    torchrun too): no false alarm when ddpdoctor names the launcher's failure first, and one
    when it blames the training."""
    work = tmp_path / "job"
    (work / "run" / "logs" / "vm").mkdir(parents=True)
    (work / "stderr").write_text("")
    (work / "run" / "logs" / "vm" / "torchrun.log").write_text(
        "terminate called without an active exception\nFatal Python error: Aborted\n"
    )
    doc = {"ranks": [{"exit_code": 0}, {"exit_code": 0}]}
    assert bench._aborted_after_clean_exits(doc, work)
    assert not bench._aborted_after_clean_exits(
        {"ranks": [{"exit_code": 0}, {"exit_code": -6}]}, work
    )
    said = bench.Outcome(HEALTHY, 1, "crash", (1,), ("run.launcher_failed",), None, None, 9.0, True)
    assert said.aborted_at_exit and not said.false_alarm
    blamed = bench.Outcome(HEALTHY, 1, "hang", (1,), ("hang",), "hang", 5.0, 9.0, True)
    assert blamed.false_alarm
    plain = bench.Outcome(HEALTHY, 1, "crash", (1,), ("run.launcher_failed",), None, None, 9.0)
    assert plain.false_alarm  # without the abort in its logs, a failed healthy job is an alarm
    assert "aborted by torch at exit, said so: 1" in "\n".join(bench.summary([said], []))


def test_the_fsdp_corpus_runs_in_both_sets_at_its_own_size():
    healthy = {job.name: job for job in bench.healthy_jobs()}
    assert healthy["fsdp-hsdp-2x2"].flags[:2] == ("--nproc", "4")
    assert healthy["fsdp-fsdp2-1d"].verdicts == {"healthy"}
    faulty = {job.name: job for job in bench.faulty_jobs()}
    assert faulty["fsdp-fsdp2-extra-wrap"].culprits == (1,)
    assert faulty["fsdp-ddp-accumulate-per-rank"].verdicts == {"mismatch"}


def test_the_ray_corpus_is_in_both_sets_with_a_longer_timeout():
    healthy = {j.name: j for j in bench.healthy_jobs()}
    faulty = {j.name: j for j in bench.faulty_jobs()}
    assert {"ray-train", "ray-actors"} <= set(healthy)
    assert {"ray-train-stall", "ray-train-sigkill", "ray-actors-stall"} <= set(faulty)
    job = faulty["ray-train-sigkill"]
    assert job.verdicts == {"crash"} and job.culprits == (1,) and job.flags == ()
    assert job.args[1] == sys.executable and job.args[2].endswith("ray_train.py")
    assert job.timeout_s > bench.RUN_TIMEOUT_S


def test_the_torchft_corpus_recovering_jobs_are_healthy_with_their_warning_expected():
    healthy = {j.name: j for j in bench.healthy_jobs()}
    faulty = {j.name: j for j in bench.faulty_jobs()}
    assert {"torchft-ddp", "torchft-manual", "torchft-ddp-sigkill"} <= set(healthy)
    recovering = healthy["torchft-manual-sigkill"]
    assert recovering.verdicts == {"healthy"} and recovering.flags == ()
    assert recovering.args[1:] == (
        "python",
        str(sys.modules["corpus_jobs"].TORCHFT / "launch.py"),
        "train_manual.py",
        "sigkill",
    )
    recovered = ("torchft.replica_recovered",)
    assert not outcome(recovering, "healthy", loud=recovered).false_alarm
    assert outcome(healthy["torchft-ddp"], "healthy", loud=recovered).false_alarm
    assert outcome(recovering, "healthy", loud=(*recovered, "crash")).false_alarm
    assert faulty["torchft-ddp-stall"].verdicts == {"hang"}
    assert faulty["torchft-ddp-stall"].culprits == (1,)
