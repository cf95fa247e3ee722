"""`ddpdoctor run -- COMMAND`: which words are a script for ddpdoctor's torchrun and which a
program run as given; the plan, run.json and the job's environment for a program."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ddpdoctor import cli
from ddpdoctor.errors import UsageError
from ddpdoctor.launch.command import COMMAND, SCRIPT, classify, program_kind
from ddpdoctor.launch.plan import plan_from_args, run_json_document
from ddpdoctor.launch.user_command import command_env
from ddpdoctor.protocol.rundir import ENV_RUN_DIR, RunDir
from ddpdoctor.runtime.autostart import ENV_SLURM_ENV, SITE_DIR, with_site_dir


def plan(*argv: str, gpus: int = 0):
    args = cli.parse_args(["run", *argv])
    return plan_from_args(args, gpu_count=lambda: gpus, argv=["run", *argv])


@pytest.fixture
def bin_dir(tmp_path, monkeypatch):
    """A PATH with real executables named like the launchers (shell scripts that exit 0)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("torchrun", "srun", "mpirun", "accelerate", "deepspeed", "mylauncher"):
        path = folder / name
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    return folder


def test_a_py_file_and_a_module_are_scripts(tmp_path):
    assert classify(["train.py", "--lr", "1"]).mode == SCRIPT
    assert classify(["-m", "pkg.train"]).kind == "module"


@pytest.mark.parametrize(
    ("argv", "kind"),
    [
        (["torchrun", "--nproc-per-node", "2", "train.py"], "torchrun"),
        (["srun", "-n", "2", "python", "train.py"], "srun"),
        (["mpirun", "-np", "2", "python", "train.py"], "mpirun"),
        (["accelerate", "launch", "train.py"], "accelerate"),
        (["deepspeed", "train.py"], "deepspeed"),
        (["mylauncher", "train.py"], "program"),
    ],
)
def test_programs_on_path_run_as_given(bin_dir, argv, kind):
    command = classify(argv)
    assert (command.mode, command.kind, command.argv) == (COMMAND, kind, tuple(argv))


def test_python_and_python_m_torch_distributed_run():
    assert classify([sys.executable, "train.py"]).kind == "python"
    assert program_kind(["python3", "-m", "torch.distributed.run", "x.py"]) == "torchrun"
    assert program_kind(["python", "-m", "torch.distributed.launch", "x.py"]) == "torchrun"
    assert program_kind(["python", "-m", "pkg.train"]) == "python"


def test_a_program_not_found_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="command not found: nosuchlauncher"):
        classify(["nosuchlauncher", "x"])
    with pytest.raises(UsageError, match="no such executable file"):
        classify([str(tmp_path / "missing"), "x"])


def test_the_python_script_a_program_runs_is_what_the_checkup_reads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text("print(1)\n")
    assert classify([sys.executable, "train.py"]).python_script == "train.py"
    assert classify([sys.executable, "-c", "pass"]).python_script is None


def test_a_command_plan_has_no_world_size_and_no_torchrun(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("train.py").write_text("print(1)\n")
    p = plan("--no-doctor", "--", sys.executable, "train.py", "4")
    assert p.command is not None and p.command.kind == "python"
    assert p.world_size is None
    assert p.job_name == f"{os.path.basename(sys.executable)} train.py"
    assert plan("--", sys.executable, "-c", "pass").job_name == os.path.basename(sys.executable)
    assert p.checkup_scripts == ("train.py",) and p.slurm_env
    doc = run_json_document(p, run_dir=tmp_path, torchrun=list(p.command.argv))
    assert doc["launch_mode"] == "command" and doc["launcher_kind"] == "python"
    assert doc["torchrun"] is None and doc["job_command"] == [sys.executable, "train.py", "4"]
    assert doc["world_size"] is None and doc["nproc_per_node"] is None


def test_no_slurm_env_is_in_the_plan_and_the_environment(tmp_path):
    p = plan("--no-slurm-env", "--", sys.executable, "-c", "pass")
    assert not p.slurm_env
    env = command_env(
        {"PATH": "/bin"}, run_dir=RunDir(tmp_path), backend="gloo", torch_version=None,
        slurm_env=False,
    )  # fmt: skip
    assert env[ENV_SLURM_ENV] == "0"


@pytest.mark.parametrize(
    "flags",
    [
        ["--nproc", "2"],
        ["--nnodes", "2"],
        ["--master-port", "29500"],
        ["--rdzv-endpoint", "h:1"],
        ["--steps", "3"],
    ],
)
def test_torchrun_and_reference_flags_do_not_go_with_a_command(flags):
    with pytest.raises(UsageError, match="only apply when ddpdoctor starts torchrun itself"):
        plan(*flags, "--", sys.executable, "train.py")


def test_the_job_env_puts_the_sitecustomize_first_and_keeps_the_users_path(tmp_path):
    env = command_env(
        {"PYTHONPATH": f"/a{os.pathsep}/b"}, run_dir=RunDir(tmp_path), backend="gloo",
        torch_version=None,
    )  # fmt: skip
    assert env["PYTHONPATH"].split(os.pathsep) == [str(SITE_DIR), "/a", "/b"]
    assert env[ENV_RUN_DIR] == str(tmp_path.resolve())
    assert ENV_SLURM_ENV not in env
    assert with_site_dir(env["PYTHONPATH"]) == env["PYTHONPATH"]  # once, however often
    assert with_site_dir(None) == str(SITE_DIR)


def test_a_script_that_spawns_its_own_ranks_is_recognised(tmp_path):
    from ddpdoctor.launch.command import spawn_hint, starts_own_ranks

    tutorial = Path(__file__).resolve().parents[2] / "corpus" / "ddp_tutorial_series"
    assert starts_own_ranks(str(tutorial / "multigpu.py"))  # mp.spawn(main, ...)
    assert not starts_own_ranks(str(tutorial / "multigpu_torchrun.py"))
    other = tmp_path / "s.py"
    other.write_text("import torch.multiprocessing\ntorch.multiprocessing.start_processes(f)\n")
    assert starts_own_ranks(str(other))
    other.write_text("def broken(:\n")
    assert not starts_own_ranks(str(other))
    assert "ddpdoctor run -- python multigpu.py" in spawn_hint("multigpu.py")


def test_the_guard_exits_as_its_command_did(tmp_path):
    import signal
    import subprocess

    from ddpdoctor.launch.user_command import guarded_argv

    def guarded(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            guarded_argv(command), capture_output=True, text=True, timeout=60, cwd=tmp_path
        )

    assert guarded("sh", "-c", "echo out; exit 3").returncode == 3
    assert guarded("sh", "-c", "echo out; exit 3").stdout == "out\n"
    assert guarded("sh", "-c", "kill -TERM $$").returncode == -signal.SIGTERM
    missing = guarded(str(tmp_path / "nothing-here"))
    assert missing.returncode == 127 and missing.stderr.startswith("ddpdoctor: error: cannot run")
    assert guarded().returncode == 2
