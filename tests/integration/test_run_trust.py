"""The trust boundary end to end: text a job prints is explained, never acted on."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_a_printed_torchrun_table_never_stops_a_healthy_job(shared_runs):
    """A user's torchrun, whose output (its own lines and the ranks', one stream) lands in
    torchrun.log: rank 0 printed a failure table naming rank 1's pid as SIGKILLed. It once made
    a CRASH verdict and got the healthy job stopped."""
    result = shared_runs.get("forged-table")
    assert result.returncode == 0, result.explain()
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "healthy", result.explain()
    assert doc["job"]["stopped_for"] is None and doc["job"]["torchrun_exit_code"] == 0
    assert [r["state"] for r in doc["ranks"]] == ["done", "done"]
    assert not [f for f in doc["findings"] if f["severity"] == "error"], doc["findings"]
    reports = [f for f in doc["findings"] if f["id"] == "torchrun.killed"]
    assert reports and all(f["summary"].startswith("not acted on") for f in reports)
    assert doc["job"]["rank_exits"] == [] and "SIGKILL (torchrun)" not in result.stderr
