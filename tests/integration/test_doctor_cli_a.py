"""`python -m ddpdoctor doctor launcher gpu nccl --json` as users run it: real subprocesses with
crafted environments. Each bad input must give its named result, exit 1, valid JSON on stdout and
no traceback on stderr."""

from __future__ import annotations

import json

import pytest

from tests.procs import PYTHON, REPO, clean_env, ddpdoctor_cmd, run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def doctor(env_extra: dict[str, str], *args: str) -> tuple[int, dict, str]:
    env = clean_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)  # only what the test sets
    env.update(env_extra)
    done = run(
        ddpdoctor_cmd("doctor", "launcher", "gpu", "nccl", "--json", *args),
        timeout=60,
        env=env,
        cwd=REPO,
    )
    assert "Traceback" not in done.stderr, done.stderr
    report = json.loads(done.stdout)  # stdout carries only JSON
    assert report["exit_code"] == done.returncode
    return done.returncode, report, done.stderr


def result(report: dict, check_id: str) -> dict:
    return next(r for r in report["results"] if r["id"] == check_id)


BAD_INPUTS = [
    ({"WORLD_SIZE": "abc", "RANK": "0", **MASTER}, "launcher.env", "fail", "WORLD_SIZE='abc'"),
    ({"RANK": "-1", "WORLD_SIZE": "2", **MASTER}, "launcher.env", "fail", "RANK=-1 is negative"),
    ({"RANK": "2", "WORLD_SIZE": "2", **MASTER}, "launcher.env", "fail", "RANK=2 is not below"),
    ({"CUDA_VISIBLE_DEVICES": ",,7"}, "gpu.visible_devices", "fail", "empty entry"),
]


@pytest.mark.parametrize(("env", "check_id", "status", "words"), BAD_INPUTS)
def test_bad_input_is_a_named_failure(env, check_id, status, words):
    code, report, _ = doctor(env)
    assert code == 1
    named = result(report, check_id)
    assert named["status"] == status
    assert words in named["summary"]
    assert named["fix"]
    others = [r for r in report["results"] if r["status"] in ("fail", "error")]
    assert [r["id"] for r in others] == [check_id], "only the check that owns the input fails"


def test_nccl_variable_typo_warns_and_fails_under_strict():
    code, report, _ = doctor({"NCCL_DEUBG": "INFO"})
    assert code == 0  # a warning alone: ready for DDP
    typo = result(report, "nccl.env")
    assert typo["status"] == "warn" and "did you mean NCCL_DEBUG?" in typo["summary"]
    strict, report, _ = doctor({"NCCL_DEUBG": "INFO"}, "--strict")
    assert strict == 1


def test_this_machine_is_ready_for_gloo():
    code, report, _ = doctor({})
    assert code == 0
    assert report["counts"]["fail"] == 0 and report["counts"]["error"] == 0
    ids = [r["id"] for r in report["results"]]
    assert ids[:3] == ["launcher.detect", "launcher.env", "launcher.slurm"]
    assert {"gpu.cuda", "gpu.visible_devices", "gpu.count", "gpu.devices"} <= set(ids)
    assert {"nccl.available", "nccl.env", "nccl.ifname", "nccl.debug_file"} <= set(ids)
    cuda = result(report, "gpu.cuda")
    if cuda["facts"]["gpus"] == 0:
        assert "gloo on the CPU" in cuda["summary"]


def test_text_report_and_verbose_details():
    env = clean_env({"NCCL_DEUBG": "INFO", "COLUMNS": "200"})  # no wrapping inside phrases
    done = run(ddpdoctor_cmd("doctor", "launcher", "gpu", "nccl", "-v"), timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "Launcher and environment" in done.stdout and "NCCL" in done.stdout
    assert "fix: rename NCCL_DEUBG to NCCL_DEBUG" in done.stdout
    assert "configuration files:" in done.stdout  # a detail shown only with -v
    assert "Summary:" in done.stdout


def test_the_doctor_does_not_import_torch_without_a_gpu():
    code = (
        "import sys\n"
        "from ddpdoctor.cli import main\n"
        "rc = main(['doctor', 'launcher', 'gpu', 'nccl', '--json'])\n"
        "print('TORCH-IMPORTED' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    done = run([PYTHON, "-c", code], timeout=60, env=clean_env(), cwd=REPO)
    report = json.loads(done.stdout)
    if result(report, "gpu.cuda")["facts"]["gpus"]:
        pytest.skip("GPUs present: the doctor may ask torch")
    assert "NO-TORCH" in done.stderr
