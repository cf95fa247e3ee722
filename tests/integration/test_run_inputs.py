"""`ddpdoctor run` with bad input (one line, exit 2, nothing started) and with user scripts that
exit on their own terms, reported faithfully."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from ddpdoctor.launch.supervise import STACK_WAIT_S
from ddpdoctor.protocol.events import parse_event_line
from tests.procs import REPO, background, ddpdoctor_cmd, job_processes, run, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--inject", "explode:rank=0"], "unknown fault kind 'explode'"),
        (["--inject", "hang:rank=7"], "rank 7 is outside the world"),
        (["--", "no/such/train.py"], "script not found: no/such/train.py"),
        (
            ["--inject", "hang:rank=0", "--", "sample_jobs/healthy.py"],
            "only works with the reference job",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    run_dir = tmp_path / "run"
    result = run(
        ddpdoctor_cmd("run", "--no-tui", "--no-doctor", "--run-dir", str(run_dir), *args),
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("ddpdoctor: error: ")
    assert message in result.stderr
    assert not run_dir.exists()  # checked before anything was created or started


def test_run_directory_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run(
        ddpdoctor_cmd("run", "--no-tui", "--no-doctor", "--run-dir", str(blocker / "run")),
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("ddpdoctor: error: cannot create run directory")


# Each rank ends on its own terms, in a fixed order: rank 0 says it has started, then rank 1 fails to
# import; torchrun then stops rank 0, which exits with its own code 3. (Without the handshake, torchrun
# could stop rank 0 before its first line when rank 1 fails first.)
SCRIPT = """\
import os
import signal
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
print(f"rank {os.environ['RANK']} starting", flush=True)
if os.environ["RANK"] == "0":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    open(os.path.join(here, "rank0-started"), "w").close()
    time.sleep(60)
    sys.exit(3)
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(here, "rank0-started")) and time.monotonic() < deadline:
    time.sleep(0.05)
import a_module_that_does_not_exist  # noqa: F401  (rank 1 fails to import)
"""


def test_user_scripts_exit_codes_are_reported_faithfully(tmp_path):
    script = tmp_path / "quits.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    args = ["--nproc", "2", "--no-doctor", "--run-dir", str(run_dir), "--", str(script)]
    result = run(ddpdoctor_cmd("run", "--no-tui", *args), timeout=180)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[default0]:rank 0 starting" in result.stdout
    assert "rank 0 exited with code 3" in result.stdout
    assert "rank 1 exited with code 1" in result.stdout
    rank1 = [
        e
        for e in map(
            parse_event_line, (run_dir / "events" / "rank-1.jsonl").read_text().splitlines()
        )
        if e is not None
    ]
    errors = [e for e in rank1 if e["kind"] == "error"]
    assert errors and "ModuleNotFoundError" in errors[0]["exc_type"]


def test_keep_running_leaves_a_hung_job_until_ctrl_c_which_exits_130(tmp_path):
    run_dir = tmp_path / "run"
    args = ["--nproc", "2", "--no-doctor", "--run-dir", str(run_dir), "--steps", "100000"]
    args += ["--inject", "hang:rank=1,step=3", "--hang-after", "2", "--keep-running"]
    with background(ddpdoctor_cmd("run", "--no-tui", *args)) as launcher:
        wait_for(lambda: _verdict(run_dir) == "hang", timeout=150, what="the hang verdict")
        # Past the moment the launcher would otherwise have stopped it (once the stacks are in).
        wait_for(lambda: _stacks_settled(run_dir), timeout=STACK_WAIT_S, what="the stacks")
        time.sleep(1.0)
        assert launcher.poll() is None
        assert len(job_processes(run_dir)) >= 3  # torchrun and both ranks still there
        launcher.send_signal(signal.SIGINT)
        out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 130
    assert "interrupted: the job was stopped" in out
    assert "(exit code 130)" in out
    assert job_processes(run_dir) == []


def _stacks_settled(run_dir: Path) -> bool:
    try:
        diagnosis = json.loads((run_dir / "diagnosis.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(diagnosis.get("stacks"))


def _verdict(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "diagnosis.json").read_text())["verdict"]
    except (OSError, ValueError, KeyError):
        return None
