"""The torchrun command line and the ranks' environment."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ddpdoctor.launch.plan import installed_torch_version
from ddpdoctor.launch.torchrun_cmd import (
    Rendezvous,
    flight_recorder_env,
    job_env,
    parse_version,
    program_argv,
    torchrun_argv,
)
from ddpdoctor.launch.torchrun_process import RANK_LINE
from ddpdoctor.protocol.rundir import ENV_RUN_DIR, RunDir


def test_single_node_is_standalone_with_per_rank_logs(tmp_path):
    argv = torchrun_argv(
        nproc_per_node=2,
        rendezvous=Rendezvous(),
        log_dir=tmp_path / "logs" / "vm",
        program=program_argv(None, [], ["--steps", "5"]),
        python="/usr/bin/python3",
    )
    assert argv[:5] == ["/usr/bin/python3", "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    assert "--standalone" in argv
    i = argv.index("--log-dir")
    assert argv[i : i + 4] == [
        "--log-dir", str(tmp_path / "logs" / "vm"), "--redirects", "3",
    ]  # fmt: skip
    # No --tee: the launcher reads the rank logs back itself (nothing of the job passes through it)
    assert "--tee" not in argv
    assert argv[-4:] == ["-m", "ddpdoctor.reference", "--steps", "5"]


def test_rendezvous_arguments():
    assert Rendezvous(nnodes="1").standalone
    static = Rendezvous(master_port=29400)
    assert not static.standalone and static.argv() == ["--master-port", "29400"]
    c10d = Rendezvous(nnodes="2:4", rdzv_backend="c10d", rdzv_endpoint="h:1", rdzv_id="job7")
    assert c10d.argv() == [
        "--nnodes", "2:4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--rdzv-id", "job7",
    ]  # fmt: skip


def test_user_script_program_keeps_its_arguments_verbatim():
    assert program_argv("train.py", ["--lr", "0.1", "-m"], []) == [
        "-m", "ddpdoctor.runtime.bootstrap", "train.py", "--lr", "0.1", "-m",
    ]  # fmt: skip


def test_gloo_env(tmp_path):
    run = RunDir(tmp_path / "run")
    env = job_env({"PATH": "/bin"}, run_dir=run, backend="gloo", torch_version="2.14.1")
    assert env[ENV_RUN_DIR] == str((tmp_path / "run").resolve())
    assert env["PYTHONUNBUFFERED"] == "1" and env["PATH"] == "/bin"
    assert not [k for k in env if k.startswith("NCCL_")]
    # gloo's collectives are in the flight recorder too (torch >= 2.8): only its size is set
    assert [k for k in env if k.startswith("TORCH_")] == ["TORCH_FR_BUFFER_SIZE"]
    assert env["TORCH_FR_BUFFER_SIZE"] == "256"
    assert "DDPDOCTOR_DDP_BUCKETS" not in env


def test_gloo_env_keeps_the_users_recorder_size_and_old_torch_gets_none(tmp_path):
    run = RunDir(tmp_path / "run")
    env = job_env({"TORCH_FR_BUFFER_SIZE": "0"}, run_dir=run, backend="gloo", torch_version="2.14")
    assert env["TORCH_FR_BUFFER_SIZE"] == "0"
    old = job_env({}, run_dir=run, backend="gloo", torch_version="2.5.1")
    assert "TORCH_FR_BUFFER_SIZE" not in old


def test_ddp_buckets_flag_sets_the_variable(tmp_path):
    run = RunDir(tmp_path / "run")
    env = job_env({}, run_dir=run, backend="gloo", torch_version="2.14.1", ddp_buckets=True)
    assert env["DDPDOCTOR_DDP_BUCKETS"] == "1"


def test_nccl_env_for_current_torch(tmp_path):
    run = RunDir(tmp_path / "run")
    env = job_env({}, run_dir=run, backend="nccl", torch_version="2.14.1+cu130")
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_DEBUG_FILE"] == str(tmp_path / "run" / "nccl" / "%h.%p.log")
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "run" / "nccl" / "fr_trace_rank_")
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env  # deprecated alias: not set on new torch


def test_nccl_env_for_older_torch(tmp_path):
    run = RunDir(tmp_path / "run")
    env = job_env({}, run_dir=run, backend="nccl", torch_version="2.5.1")
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].endswith("fr_trace_rank_")
    assert "TORCH_FR_BUFFER_SIZE" not in env
    assert flight_recorder_env("2.1.0", run) == []
    assert flight_recorder_env(None, run) == []


def test_users_values_win_under_any_alias(tmp_path):
    run = RunDir(tmp_path / "run")
    base = {"NCCL_DEBUG": "WARN", "TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "PYTHONUNBUFFERED": "0"}
    env = job_env(base, run_dir=run, backend="nccl", torch_version="2.14.1")
    assert env["NCCL_DEBUG"] == "WARN" and env["PYTHONUNBUFFERED"] == "0"
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50" and "TORCH_FR_BUFFER_SIZE" not in env
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2.14.1+cu130", (2, 14)), ("2.8.0", (2, 8)), ("2.3", (2, 3)), ("x", None), (None, None)],
)
def test_parse_version(text, expected):
    assert parse_version(text) == expected


def test_installed_torch_reads_the_flight_recorder_names_we_set(tmp_path):
    """A recorded fact checked against the installed torch: its Python code names the variable
    the launcher sets for its version."""
    version = parse_version(installed_torch_version())
    spec = importlib.util.find_spec("torch")
    if version is None or spec is None or not spec.submodule_search_locations:
        pytest.skip("torch is not installed")
    c10d = Path(next(iter(spec.submodule_search_locations))) / "distributed" / "distributed_c10d.py"
    names = [n for names, _ in flight_recorder_env(installed_torch_version(), RunDir(tmp_path))
             for n in names]  # fmt: skip
    if version >= (2, 8):
        assert "TORCH_FR_BUFFER_SIZE" in names
        assert "TORCH_FR_BUFFER_SIZE" in c10d.read_text()


def test_rank_lines_are_told_from_torchruns_own():
    assert RANK_LINE.match("[default0]:step 10/40 loss 1.0")
    assert RANK_LINE.match("[default12]:")
    assert not RANK_LINE.match("[rank1]: Traceback (most recent call last):")
    assert not RANK_LINE.match("W1122 04:11:28.233000 8802 torch/distributed/elastic/agent ...")
    assert not RANK_LINE.match("  exitcode  : 3 (pid: 9835)")


@pytest.mark.parametrize(
    ("rendezvous", "point"),
    [
        (Rendezvous(rdzv_endpoint="10.0.0.1:29401"), ("10.0.0.1", 29401)),
        (Rendezvous(rdzv_endpoint="node1"), ("node1", 29400)),  # torchrun's default port
        (Rendezvous(rdzv_endpoint="[::1]:5000"), ("::1", 5000)),
        (Rendezvous(master_addr="a", master_port=3, rdzv_endpoint="b:4"), ("a", 3)),
        (Rendezvous(), (None, None)),
    ],
)
def test_the_doctor_checks_the_address_every_node_must_reach(rendezvous, point):
    assert rendezvous.meeting_point() == point
