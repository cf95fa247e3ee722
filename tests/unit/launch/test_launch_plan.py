"""The launch plan: defaults, the reference job's arguments, run.json, and every usage error."""

from __future__ import annotations

import pytest

from ddpdoctor import cli
from ddpdoctor.errors import UsageError
from ddpdoctor.exit_codes import ExitCode
from ddpdoctor.launch.plan import parse_nnodes, plan_from_args, run_json_document
from ddpdoctor.launch.torchrun_cmd import BOOTSTRAP_MODULE, REFERENCE_MODULE


def plan(*argv: str, gpus: int = 0):
    args = cli.parse_args(["run", *argv])
    return plan_from_args(args, gpu_count=lambda: gpus, argv=["run", *argv])


def test_defaults_without_gpu_are_two_gloo_ranks_of_the_reference_job():
    p = plan()
    assert (p.nproc_per_node, p.world_size, p.backend) == (2, 2, "gloo")
    assert p.script is None and p.job_name == "reference"
    assert p.total_steps == 40
    assert p.program[:2] == ["-m", REFERENCE_MODULE]
    assert p.reference_args == ("--steps", "40", "--backend", "gloo")
    assert p.rendezvous.standalone and p.doctor and p.tui_allowed


def test_gpus_choose_nproc_and_nccl():
    p = plan(gpus=4)
    assert (p.nproc_per_node, p.backend) == (4, "nccl")
    assert plan("--backend", "gloo", "--nproc", "3", gpus=4).backend == "gloo"


def test_reference_options_and_faults_are_passed_on(tmp_path):
    p = plan(
        "--steps",
        "12",
        "--model",
        "cnn",
        "--batch-size",
        "8",
        "--workers",
        "1",
        "--data",
        str(tmp_path),
        "--inject",
        "hang:rank=1,step=3",
        "--inject",
        "slow:rank=0",
    )
    args = list(p.reference_args)
    assert args[:2] == ["--steps", "12"]
    assert args[args.index("--data") + 1] == str(tmp_path.resolve())
    assert [args[i + 1] for i, a in enumerate(args) if a == "--inject"] == [
        "hang:rank=1,step=3",
        "slow:rank=0,step=5,seconds=0.5",
    ]
    assert p.total_steps == 12 and [s.kind for s in p.injects] == ["hang", "slow"]


def test_user_script_runs_through_the_bootstrap(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    p = plan("--no-tui", "--", str(script), "--lr", "0.1")
    assert p.program == ["-m", BOOTSTRAP_MODULE, str(script), "--lr", "0.1"]
    assert p.total_steps is None and p.reference_args == ()
    assert not p.tui_allowed
    module = plan("--", "-m", "pkg.train", "--x")
    assert module.program == ["-m", BOOTSTRAP_MODULE, "-m", "pkg.train", "--x"]
    assert module.job_name == "pkg.train"


def test_multi_node_world_and_rendezvous():
    p = plan(
        "--nproc", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
        "--master-port", "29400", "--inject", "crash:rank=3",
    )  # fmt: skip
    assert p.world_size == 4 and not p.rendezvous.standalone
    assert p.rendezvous.argv() == [
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29400",
    ]  # fmt: skip


def test_join_timeout_goes_to_torchrun_under_the_name_its_rendezvous_reads():
    static = plan("--nnodes", "2", "--node-rank", "0", "--master-addr", "h", "--join-timeout", "30")
    assert static.rendezvous.argv()[-2:] == ["--rdzv-conf", "timeout=30"]
    c10d = plan(
        "--nnodes", "2", "--node-rank", "0", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29400",
        "--join-timeout", "30",
    )  # fmt: skip
    assert c10d.rendezvous.argv()[-2:] == ["--rdzv-conf", "join_timeout=30"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--inject", "explode:rank=0"], "unknown fault kind"),
        (["--inject", "hang:rank=2"], "outside the world"),
        (["--nproc", "3", "--inject", "crash:rank=3,step=2"], "world size 3"),
        (["--nnodes", "0"], "--nnodes"),
        (["--nnodes", "4:2"], "--nnodes"),
        (["--nnodes", "2"], "--rdzv-endpoint"),
        (["--data", "/nonexistent/cifar"], "no such directory"),
        (["--", "/nonexistent/train.py"], "script not found"),
        (["--", "-m"], "module name"),
        (["--batch-size", "2000"], "larger than each rank's share"),
        (["--join-timeout", "60"], "only applies to a job that spans nodes"),
    ],
)
def test_bad_plans_are_usage_errors(argv, message):
    with pytest.raises(UsageError, match=message):
        plan(*argv)


def test_faults_and_reference_flags_refuse_a_user_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(UsageError, match="only works with the reference job"):
        plan("--inject", "hang:rank=0", "--", str(script))
    with pytest.raises(UsageError, match="--steps, --model only apply to the reference job"):
        plan("--steps", "3", "--model", "cnn", "--", str(script))


def test_parse_nnodes():
    assert parse_nnodes(None) == 1
    assert parse_nnodes("3") == 3
    assert parse_nnodes("1:4") == 4
    for bad in ("x", "1:2:3", "-1", ""):
        with pytest.raises(UsageError):
            parse_nnodes(bad)


def test_run_json_document(tmp_path):
    p = plan("--inject", "hang:rank=1,step=3", "--hang-after", "4")
    doc = run_json_document(
        p, run_dir=tmp_path / "r1", torchrun=["torchrun"], started_t=100.0, torch_version="2.14.1"
    )
    assert doc["name"] == "r1" and doc["started_t"] == 100.0
    assert doc["command"].startswith("ddpdoctor run --inject")
    assert doc["argv"][:2] == ["ddpdoctor", "run"]
    assert (doc["world_size"], doc["nproc_per_node"], doc["nnodes"]) == (2, 2, 1)
    assert doc["backend"] == "gloo" and doc["script"] == "reference"
    assert doc["inject"] == ["hang:rank=1,step=3"]
    assert doc["total_steps"] == 40 and doc["hang_after"] == 4.0
    assert doc["versions"]["torch"] == "2.14.1" and doc["versions"]["ddpdoctor"]
    assert doc["hosts"] and doc["torchrun"] == ["torchrun"]


def test_cli_usage_errors_are_one_line_and_exit_2(capsys, tmp_path):
    cases = [
        ["run", "--inject", "explode:rank=0"],
        ["run", "--nproc", "2", "--inject", "hang:rank=5"],
        ["run", "--", str(tmp_path / "missing.py")],
        ["run", "--no-doctor", "--run-dir", "/proc/ddpdoctor-cannot-create"],
    ]
    for argv in cases:
        code = cli.main(argv)
        out, err = capsys.readouterr()
        assert code == ExitCode.USAGE, argv
        assert out == ""
        assert len(err.strip().splitlines()) == 1 and err.startswith("ddpdoctor: error: ")


def test_ddp_buckets_is_off_unless_asked():
    assert plan().ddp_buckets is False
    assert plan("--ddp-buckets").ddp_buckets is True
    assert plan("--ddp-buckets", "--", "sample_jobs/healthy.py").ddp_buckets is True
