"""The sample jobs: plain DDP scripts that run the same under plain torchrun and under
`ddpdoctor run` (through the bootstrap), and the sampler audit on missing_set_epoch.py.

Both runs of missing_set_epoch.py are the session's shared runs (tests/integration/conftest.py):
test_diagnose_jobs reads the verdict of the same `ddpdoctor run`."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from ddpdoctor.protocol.events import parse_event_line
from tests.integration.conftest import Result
from tests.procs import REPO, job_processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

SAMPLES = REPO / "sample_jobs"
PREFIX = re.compile(r"^\[default\d+\]:")


def job_lines(output: str) -> list[str]:
    """The job's own lines, without torchrun's rank prefix and without ddpdoctor's status."""
    return [
        PREFIX.sub("", line)
        for line in output.splitlines()
        if line.startswith(("epoch", "[default"))
    ]


def events(run_dir: Path, rank: int) -> list[dict]:
    lines = (run_dir / "events" / f"rank-{rank}.jsonl").read_text().splitlines()
    return [e for e in map(parse_event_line, lines) if e is not None]


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_samples_are_plain_ddp_scripts_that_explain_themselves(path):
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree) or ""
    imports = [
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in (n.names if isinstance(n, ast.Import) else [n])
    ]
    assert not [m for m in imports if m and m.startswith("ddpdoctor")]
    assert "How it shows" in doc
    if path.name != "healthy.py":
        assert "What is wrong" in doc and "How to fix" in doc
    assert "__main__" in path.read_text()


def test_readme_lists_every_sample():
    readme = (SAMPLES / "README.md").read_text()
    for path in SAMPLES.glob("*.py"):
        assert f"`{path.name}`" in readme


@pytest.fixture
def missing_set_epoch(shared_runs) -> tuple[Result, Result, Path]:
    """missing_set_epoch.py twice: under plain torchrun, and under ddpdoctor through the bootstrap.
    It finishes (exit 0) and prints deterministic lines, so the two runs must print the same."""
    watched = shared_runs["sample-missing_set_epoch"]
    return shared_runs["plain-missing_set_epoch"], watched, watched.run_dir


def test_a_sample_behaves_the_same_with_and_without_ddpdoctor(missing_set_epoch):
    plain, watched, run_dir = missing_set_epoch
    assert plain.returncode == watched.returncode == 0, watched.stdout[-3000:]
    expected = [line for line in plain.stdout.splitlines() if line.startswith("epoch")]
    assert len(expected) == 6
    assert job_lines(watched.stdout) == expected
    assert "verdict: healthy (exit code 0)" in watched.stdout
    for rank in (0, 1):
        kinds = {e["kind"] for e in events(run_dir, rank)}
        assert {"hello", "step", "collective_start", "epoch", "exit"} <= kinds
    assert job_processes(run_dir) == []


def test_missing_set_epoch_is_caught_by_the_sampler_audit(missing_set_epoch):
    _, _, run_dir = missing_set_epoch
    for rank in (0, 1):
        warnings = [e for e in events(run_dir, rank) if e["kind"] == "warning"]
        assert "sampler.set_epoch_missing" in {w["code"] for w in warnings}
    findings = json.loads((run_dir / "diagnosis.json").read_text())["findings"]
    assert "sampler.set_epoch_missing" in {f["id"] for f in findings}
