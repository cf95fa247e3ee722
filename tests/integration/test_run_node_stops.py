"""One story across nodes, on one host: two `ddpdoctor run --nnodes 2` launchers, and Ctrl-C
(SIGINT) to node 1's while the job trains. Before, node 0 said crash (exit 1) and node 1
interrupted (130). Now both say interrupted, exit 130, and node 0 names where it came from."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.procs import background, clean_env, ddpdoctor_cmd, free_port, job_processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LAUNCH_TIMEOUT_S = 200


def _training(run_dir: Path, steps: int = 3) -> bool:
    counts = []
    for path in (run_dir / "events").glob("rank-*.jsonl"):
        with contextlib.suppress(OSError):
            counts.append(path.read_text(errors="replace").count('"kind":"step"'))
    return len(counts) == 2 and min(counts) >= steps


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("node-ctrl-c") / "run"
    env = clean_env({"DDPDOCTOR_CACHE_DIR": str(run_dir.parent / "cache")})
    common = [
        "run", "--no-tui", "--no-doctor", "--nnodes", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--run-dir", str(run_dir),
        "--nproc", "1", "--steps", "3000",
    ]  # fmt: skip
    cmds = [ddpdoctor_cmd(*common, "--node-rank", str(node)) for node in (0, 1)]
    with background(cmds[0], env=env) as lead, background(cmds[1], env=env) as follower:
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S - 60
        while not _training(run_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        follower.send_signal(signal.SIGINT)  # Ctrl-C on node 1
        ended = []
        for proc in (lead, follower):
            try:
                out, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                out, err = "", "still running"
            ended.append((proc.returncode, out, err))
    return ended, run_dir


def test_every_node_says_interrupted_and_exits_130(interrupted):
    ended, run_dir = interrupted
    explain = "\n".join(f"--- node {i}\n{out[-2500:]}\n{err[-1500:]}" for i, (_, out, err) in
                        enumerate(ended))  # fmt: skip
    assert [code for code, _, _ in ended] == [130, 130], explain
    for _, out, _ in ended:
        assert "verdict: interrupted (exit code 130)" in out, explain
        assert "CRASH" not in out.split("INTERRUPTED")[-1]
    doc = json.loads((run_dir / "diagnosis.json").read_text())
    assert doc["verdict"] == "interrupted" and doc["culprits"] == [], explain
    first = doc["findings"][0]
    assert first["id"] == "node.interrupted" and "interrupted on node 1" in first["summary"]
    assert "interrupted on another node" in ended[0][1]
    assert job_processes(run_dir) == []
