"""The flight-recorder request/answer files in the run directory."""

from __future__ import annotations

import json

from ddpdoctor.protocol import fr_requests as fr
from ddpdoctor.protocol import stack_requests
from ddpdoctor.protocol.rundir import RunDir


def test_a_request_is_seen_until_its_deadline(tmp_path):
    run = RunDir.create(tmp_path / "run")
    request = fr.write_request(run, now=100.0, timeout_s=10.0)
    assert request.id.startswith("fr-") and request.wants(3)
    assert fr.scan_requests(run, now=105.0) == [request]
    assert fr.scan_requests(run, now=110.0) == []


def test_a_request_for_some_ranks_wants_only_them(tmp_path):
    run = RunDir.create(tmp_path / "run")
    request = fr.write_request(run, ranks=(1, 2), now=100.0)
    (seen,) = fr.scan_requests(run, now=100.5)
    assert seen == request and seen.ranks == (1, 2) and seen.wants(2) and not seen.wants(0)


def test_answers_replace_each_other_per_rank(tmp_path):
    run = RunDir.create(tmp_path / "run")
    fr.write_answer(run, fr.FrAnswer("fr-a", 0, 1.0, {"entries": []}))
    fr.write_answer(run, fr.FrAnswer("fr-b", 0, 2.0, {"entries": []}))
    fr.write_answer(run, fr.FrAnswer("fr-b", 1, 2.0, None, "no flight recorder"))
    answers = fr.read_answers(run)
    assert answers[0].request_id == "fr-b" and answers[0].taken_t == 2.0
    assert answers[1].dump is None and answers[1].error == "no flight recorder"


def test_torn_foreign_and_misnamed_files_are_ignored(tmp_path):
    run = RunDir.create(tmp_path / "run")
    folder = fr.answers_dir(run)
    folder.mkdir()
    (folder / "rank-0.json").write_text('{"schema_version": 1, "rank"')  # torn
    (folder / "rank-1.json").write_text(json.dumps(fr.FrAnswer("fr-x", 2, 1.0, {}).to_json()))
    (folder / "notes.txt").write_text("hello")
    run.requests_dir.mkdir(exist_ok=True)
    (run.requests_dir / "fr-bad.json").write_text('{"kind": "flight_recorder", "id": 5}')
    assert fr.read_answers(run) == {}
    assert fr.scan_requests(run, now=0.0) == []


def test_stack_request_readers_skip_flight_recorder_requests(tmp_path):
    run = RunDir.create(tmp_path / "run")
    fr.write_request(run, now=100.0)
    assert stack_requests.scan_requests(run, now=100.0, include_expired=True) == []
    assert stack_requests.prune(run, now=1e9) == 0  # not its to remove


def test_old_expired_requests_are_pruned_beyond_the_latest_few(tmp_path):
    run = RunDir.create(tmp_path / "run")
    for i in range(fr.KEEP_REQUESTS + 5):
        fr.write_request(run, now=100.0 + i, timeout_s=1.0)
    left = sorted(p.name for p in run.requests_dir.glob("fr-*.json"))
    assert len(left) == fr.KEEP_REQUESTS  # the latest ones (the newest still live)
    assert left[-1].startswith(f"fr-{int((100.0 + fr.KEEP_REQUESTS + 4) * 1000)}-")
