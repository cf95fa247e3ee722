"""The rank's side of the flight-recorder requests: one stat a beat, one answer per request."""

from __future__ import annotations

import os

import pytest

from ddpdoctor.protocol.fr_requests import read_answers, write_request
from ddpdoctor.runtime.core import Runtime
from ddpdoctor.runtime.flight_recorder import FrResponder, recorder_status

pytest.importorskip("torch.distributed")


def responder(tmp_path, rank=1):
    runtime = Runtime(tmp_path / "run", rank=rank)
    runtime.run_dir.requests_dir.mkdir(parents=True)
    return runtime, FrResponder(runtime)


def test_nothing_is_written_until_asked(tmp_path):
    runtime, fr = responder(tmp_path)
    fr.poll()
    fr.poll()
    assert fr.answers == 0 and read_answers(runtime.run_dir) == {}


def test_a_request_is_answered_once_with_a_dump(tmp_path):
    runtime, fr = responder(tmp_path)
    request = write_request(runtime.run_dir)
    fr.poll()
    fr.poll()
    assert fr.answers == 1
    answer = read_answers(runtime.run_dir)[1]
    assert answer.request_id == request.id and answer.rank == 1
    assert answer.error is None and isinstance(answer.dump["entries"], list)
    second = write_request(runtime.run_dir)
    os.utime(runtime.run_dir.requests_dir)  # coarse timestamps: make the change visible
    fr.poll()
    assert fr.answers == 2 and read_answers(runtime.run_dir)[1].request_id == second.id


def test_requests_for_other_ranks_and_an_unknown_rank_are_left_alone(tmp_path):
    runtime, fr = responder(tmp_path)
    write_request(runtime.run_dir, ranks=(0, 2))
    fr.poll()
    assert fr.answers == 0
    unknown, fr2 = responder(tmp_path / "other", rank=None)
    write_request(unknown.run_dir)
    fr2.poll()
    assert fr2.answers == 0


def test_recorder_status_names_torch_and_the_switch(monkeypatch):
    usable, why = recorder_status()
    assert usable and "flight recorder" in why
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    usable, why = recorder_status()
    assert not usable and "TORCH_FR_BUFFER_SIZE=0" in why
