"""`ddpdoctor explain` as a real process: on recorded logs and on a run directory written live by a
real 2-rank torchrun/gloo job whose rank 1 crashes."""

from __future__ import annotations

import json
import socket

import pytest

from ddpdoctor.exit_codes import ExitCode
from tests.conftest import FIXTURES
from tests.procs import PYTHON, clean_env, ddpdoctor_cmd, free_port, run

pytestmark = pytest.mark.integration

CRASHING_JOB = """
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for _ in range(3):
    dist.all_reduce(torch.ones(4))
if dist.get_rank() == 1:
    raise RuntimeError("injected failure on rank 1")
time.sleep(60)  # rank 0 is not in a collective: torchrun stops it after rank 1 fails
"""


# Real NCCL (needs GPUs): every rank on its own GPU, or ("same") every rank on GPU 0.
NCCL_JOB = """
import os, sys
import torch
import torch.distributed as dist

device = 0 if sys.argv[1] == "same" else int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=torch.device("cuda", device))
tensor = torch.ones(4, device="cuda")
dist.all_reduce(tensor)
torch.cuda.synchronize()
dist.destroy_process_group()
"""


def explain(*args: str):
    return run(ddpdoctor_cmd("explain", *args), timeout=60)


def torchrun_into_run_dir(root, script: str, nproc: int, *args: str, env=None):
    """Run `script` under torchrun with RUN_DIR/logs/<host>/ laid out as the launcher does it
    (torchrun --log-dir, plus torchrun's own output in torchrun.log)."""
    (root / "job.py").write_text(script)
    run_dir = root / "run"
    host_logs = run_dir / "logs" / socket.gethostname()
    host_logs.mkdir(parents=True)
    cmd = [
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "--log-dir",
        str(host_logs),
        "--redirects",
        "3",
        str(root / "job.py"),
        *args,
    ]
    finished = run(cmd, timeout=240, env=env or clean_env())
    (host_logs / "torchrun.log").write_text(finished.stderr)
    return run_dir, finished


@pytest.fixture(scope="module")
def crashed_run_dir(tmp_path_factory):
    run_dir, finished = torchrun_into_run_dir(tmp_path_factory.mktemp("crash"), CRASHING_JOB, 2)
    assert finished.returncode != 0
    return run_dir


def nccl_env(run_dir) -> dict[str, str]:
    (run_dir / "nccl").mkdir(parents=True, exist_ok=True)
    return clean_env({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": str(run_dir / "nccl" / "%h.%p.log")})


def gpu_count() -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.timeout(150)
def test_a_live_crash_is_explained_from_its_run_directory(crashed_run_dir):
    result = explain("--json", str(crashed_run_dir))
    assert result.returncode == ExitCode.PROBLEMS, result.stderr
    findings = {f["id"]: f for f in json.loads(result.stdout)["findings"]}
    exception = findings["python.exception"]
    assert exception["ranks"] == [1]
    assert "RuntimeError: injected failure on rank 1" in exception["summary"]
    assert exception["evidence"][-1]["file"].endswith("/attempt_0/1/stderr.log")
    # rank 1 exits with code 1, or with SIGABRT when gloo's threads abort its exit: either way
    # torchrun's root cause is rank 1 and rank 0 is the peer it stopped
    (root,) = [f for i, f in findings.items() if i in ("torchrun.failed", "torchrun.signal")]
    assert root["ranks"] == [1] and "stopped rank 0" in root["summary"]
    assert findings["torchrun.sigterm_peers"]["severity"] == "info"


@pytest.mark.timeout(60)
def test_json_on_a_recorded_run_directory():
    result = explain("--json", str(FIXTURES / "local" / "run-gloo-size-mismatch"))
    assert result.returncode == ExitCode.PROBLEMS and result.stderr == ""
    document = json.loads(result.stdout)
    assert document["schema_version"] == 1
    assert [f["id"] for f in document["findings"]] == [
        "gloo.size_mismatch",
        "torchrun.signal",
        "gloo.peer_closed",
        "torchrun.sigterm_peers",
    ]


@pytest.mark.timeout(60)
def test_a_run_ddpdoctor_stopped_gets_its_diagnosis_not_the_sigterms():
    result = explain("--json", str(FIXTURES / "local" / "run-stopped-hang"))
    assert result.returncode == ExitCode.PROBLEMS and result.stderr == ""
    (finding,) = json.loads(result.stdout)["findings"]  # torchrun.signal (SIGTERM) is gone
    assert finding["id"] == "run.diagnosis" and finding["ranks"] == [1]
    assert finding["summary"].startswith("ddpdoctor diagnosed a hang in this run")
    assert "rank 1 never reached all_reduce #6" in finding["summary"]
    assert finding["fix"].startswith("Every rank must call the same collectives")
    # the log alone still reads as torchrun wrote it
    log = FIXTURES / "local" / "run-stopped-hang" / "logs" / "vm" / "torchrun.log"
    alone = json.loads(explain("--json", str(log)).stdout)["findings"]
    assert [f["id"] for f in alone] == ["torchrun.signal"]


@pytest.mark.timeout(60)
def test_what_the_stop_caused_on_other_nodes_is_told_as_a_consequence():
    result = explain("--json", str(FIXTURES / "local" / "run-stopped-multinode"))
    assert result.returncode == ExitCode.PROBLEMS and result.stderr == ""
    findings = json.loads(result.stdout)["findings"]
    # both nodes' SIGTERM reports are gone; the peer that saw its socket close is information
    assert [(f["id"], f["severity"]) for f in findings] == [
        ("run.diagnosis", "error"),
        ("gloo.peer_closed", "info"),
    ]
    assert findings[0]["ranks"] == [1]
    assert "rank 1 never reached all_reduce #4" in findings[0]["summary"]
    assert findings[1]["summary"].startswith("after ddpdoctor stopped the job (a consequence): ")


@pytest.mark.timeout(60)
def test_text_on_a_healthy_log_exits_0():
    result = explain(str(FIXTURES / "01-healthy-init-2gpu-p2p-nccl-2.15.log"))
    assert result.returncode == ExitCode.OK
    assert "! warning: NCCL may use container, bridge or link-local interfaces" in result.stdout
    assert result.stdout.rstrip().splitlines()[-1].endswith("no errors found (exit 0)")


@pytest.mark.timeout(60)
def test_a_missing_file_is_one_line_exit_2(tmp_path):
    result = explain(str(tmp_path / "nope.log"))
    assert result.returncode == ExitCode.USAGE and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"ddpdoctor: error: cannot read {tmp_path / 'nope.log'}: no such file or directory"
    ]


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_a_healthy_nccl_run_gives_init_facts_and_no_error(tmp_path):
    nproc = min(2, gpu_count())
    env = nccl_env(tmp_path / "run")
    run_dir, finished = torchrun_into_run_dir(tmp_path, NCCL_JOB, nproc, "own", env=env)
    assert finished.returncode == 0, finished.stderr[-3000:]
    result = explain("--json", str(run_dir))
    findings = {f["id"]: f for f in json.loads(result.stdout)["findings"]}
    assert result.returncode == ExitCode.OK, findings
    assert findings["nccl.init"]["ranks"] == list(range(nproc))
    assert "NCCL 2." in findings["nccl.init"]["summary"]


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_two_ranks_on_one_gpu_are_named(tmp_path):
    env = nccl_env(tmp_path / "run")
    run_dir, finished = torchrun_into_run_dir(tmp_path, NCCL_JOB, 2, "same", env=env)
    assert finished.returncode != 0
    result = explain("--json", str(run_dir))
    findings = {f["id"]: f for f in json.loads(result.stdout)["findings"]}
    assert result.returncode == ExitCode.PROBLEMS
    assert findings["nccl.duplicate_gpu"]["ranks"] == [0, 1]
