"""Ray Train with FailureConfig(max_failures=1): worker 1 raises once, Ray's controller retries
with a new worker group (the same world ranks, new processes) and the run finishes. ddpdoctor
must never stop it and end healthy, the failure named at warning severity (docs/recovery.md).
A local cluster its `ray.init()` starts: the ray tier (`make test-ray`), minutes on two cores."""

from __future__ import annotations

import json
import os

import pytest

from tests.procs import PYTHON, REPO, clean_env, ddpdoctor_cmd
from tests.procs import run as run_proc

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.timeout(1300)]
SCRIPT = REPO / "tests" / "corpus" / "recover" / "ray_train_retry.py"


def test_a_ray_train_retry_is_recovered_not_stopped(tmp_path):
    run_dir = tmp_path / "run"
    cmd = ddpdoctor_cmd(
        "run", "--no-doctor", "--no-tui", "--json", "--run-dir", str(run_dir),
        "--", PYTHON, str(SCRIPT), "raise",
    )  # fmt: skip
    env = clean_env({"RAY_raylet_start_wait_time_s": "600"})
    env.pop("RAY_ADDRESS", None)
    done = run_proc(cmd, timeout=1200, cwd=tmp_path, env=env)
    explain = done.stdout[-3000:] + "\n--- stderr ---\n" + done.stderr[-5000:]
    doc = json.loads(done.stdout)
    assert done.returncode == 0, explain
    assert doc["verdict"] == "healthy" and (doc.get("job") or {}).get("stopped_for") is None, (
        explain
    )
    assert not [f for f in doc["findings"] if f["severity"] == "error"], explain
    recovered = next(f for f in doc["findings"] if f["id"] == "run.recovered")
    assert "worker 1 lost its data shard" in recovered["summary"] and recovered["ranks"] == [1]
    written = json.loads((run_dir / "diagnosis.json").read_text())
    assert written["attempts"]["budget_from"] == "Ray Train FailureConfig(max_failures)"
    assert os.path.exists(run_dir / "events" / "rank-1.jsonl")
