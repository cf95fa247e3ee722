"""The run corpus (tests/corpus/run/corpus.json): real DDP scripts ddpdoctor did not shape, run for
real as `ddpdoctor run --no-tui --nproc 2 --json -- SCRIPT ARGS` (torchrun, 2 gloo ranks).

The healthy ones are CPU adaptations of pytorch/examples' DDP scripts and the tutorials' recipes
where one rank works while the others wait (rank-0 download behind a barrier, rank-0 evaluation and
checkpoint between epochs), plus batch norm, `no_sync` accumulation and `Join` with uneven inputs.
Each must end healthy with no warning, and must never be stopped: a busy rank is not a hang. Where a
rank is busy on purpose, the test also checks from the events that the others' wait really outlasted
the hang floor, so a pass means "waited past the threshold and no alarm", not "too short to tell".
The faulty one blocks rank 0 on a queue that never fills: HANG with culprit rank 0.

All jobs start in one module fixture, a few at a time (most of their time is waiting); the
`--no-doctor` preflight is skipped (it is tested elsewhere and would add seconds per job).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from ddpdoctor.monitor.model.thresholds import HANG_FLOOR_S, STARTUP_FLOOR_S
from ddpdoctor.protocol.events import parse_event_line
from tests.procs import (
    REPO,
    JsonRun,
    assert_healthy_unless_aborted_at_exit,
    ddpdoctor_cmd,
    exited_cleanly_then_aborted,
    job_processes,
    run_json_jobs,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CORPUS = REPO / "tests" / "corpus" / "run"
MANIFEST = json.loads((CORPUS / "corpus.json").read_text())
PARALLEL = 3
RUN_TIMEOUT_S = 150
FLOORS = {"startup": STARTUP_FLOOR_S, "training": HANG_FLOOR_S}
HEALTHY = {job["name"]: job for job in MANIFEST["healthy"]}
FAULTY = {job["name"]: job for job in MANIFEST["faulty"]}


Result = JsonRun  # one finished `ddpdoctor run --json` job


def _command(job: dict, work: Path) -> list[str]:
    return ddpdoctor_cmd(
        "run", "--no-tui", "--no-doctor", "--nproc", "2", "--json", "--run-dir", str(work / "run"),
        "--", str(CORPUS / job["script"]), *job["args"],
    )  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Result]:
    jobs = [*MANIFEST["healthy"], *MANIFEST["faulty"]]
    return run_json_jobs(
        {job["name"]: functools.partial(_command, job) for job in jobs},
        tmp_path_factory.mktemp("corpus"), parallel=PARALLEL, timeout_s=RUN_TIMEOUT_S,
    )  # fmt: skip


def _longest_wait(run_dir: Path) -> float:
    """The longest completed collective any rank sat in, from the events it wrote."""
    longest = 0.0
    for path in (run_dir / "events").glob("rank-*.jsonl"):
        for event in map(parse_event_line, path.read_text().splitlines()):
            if event and event["kind"] == "collective_end" and event.get("duration_s"):
                longest = max(longest, float(event["duration_s"]))
    return longest


@pytest.mark.parametrize("name", list(HEALTHY))
def test_healthy_corpus_script_is_healthy_without_warning_and_never_stopped(results, name):
    r = results[name]
    doc = r.document()
    context = f"{name}: {r.stderr[-3000:]}"
    logs = "\n".join(p.read_text(errors="replace") for p in (r.run_dir / "logs").rglob("*.log"))
    aborted = exited_cleanly_then_aborted(r.run_dir, logs, range(len(doc["ranks"])))
    assert_healthy_unless_aborted_at_exit(doc, r.returncode, aborted, context)
    if not aborted:
        assert doc["job"]["exit_code"] == 0
    assert doc["job"]["stopped_for"] is None
    assert job_processes(r.run_dir) == []


@pytest.mark.parametrize("name", [n for n, job in HEALTHY.items() if "busy_wait" in job])
def test_busy_rank_really_kept_the_others_waiting_past_the_hang_floor(results, name):
    floor = FLOORS[HEALTHY[name]["busy_wait"]]
    waited = _longest_wait(results[name].run_dir)
    assert waited > floor, f"{name}: longest wait {waited:.1f} s, floor {floor:g} s"


@pytest.mark.parametrize("name", list(FAULTY))
def test_faulty_corpus_script_gets_its_verdict_and_culprit(results, name):
    r = results[name]
    doc = r.document()
    expected = FAULTY[name]
    assert r.returncode == 1, r.stderr[-3000:]
    assert doc["verdict"] == expected["verdict"] and doc["culprits"] == expected["culprits"]
    assert doc["job"]["stopped_for"] == expected["verdict"]
    assert job_processes(r.run_dir) == []


def test_blocked_rank_0_is_shown_waiting_on_its_queue(results):
    doc = results["rank0-blocked-on-queue"].document()
    hang = next(f for f in doc["findings"] if f["id"] == "hang")
    assert hang["summary"].startswith("rank 0 never reached barrier #")
    assert any(
        0 in s["ranks"] and "rank0_blocked_on_queue.py" in "".join(s["frames"])
        for s in doc["stacks"]
    )
