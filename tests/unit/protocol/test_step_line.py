"""The step line, parsed without json.loads, reads exactly as json.loads reads it."""

from __future__ import annotations

import json
import math

import pytest

from ddpdoctor.protocol.events import parse_event_line, parse_step_line
from ddpdoctor.runtime import records


def step_line(epoch=0, loss=0.25, samples=64, step_time=0.0123, data=0.001, comm=0.002) -> bytes:
    record = (records.step, 1795705630.046983, 466.924125, 17, epoch, loss, samples, 1)
    return records.step((*record, step_time, data, comm), 3).encode()


@pytest.mark.parametrize(
    "line",
    [
        step_line(),
        step_line(epoch=None, loss=None, samples=None),
        step_line(loss=-1.5e-07, step_time=0.0, data=0.5, comm=0.9),
        step_line(loss=12345678.0),
        step_line(comm=None),  # DDP's timers not read yet: no split
    ],
)
def test_the_runtimes_step_line_reads_as_json_loads_reads_it(line):
    fast = parse_step_line(line)
    assert fast is not None
    assert fast == json.loads(line)
    assert parse_event_line(line) == json.loads(line)


def test_a_step_without_its_split_says_null_not_zero():
    fast = parse_step_line(step_line(comm=None))
    assert fast is not None
    assert fast["comm_wait_s"] is None and fast["compute_time_s"] is None
    assert fast["data_time_s"] == 0.001 and fast["step_time_s"] == 0.0123


def test_other_lines_take_the_json_path_unchanged():
    nan = step_line(loss=math.nan)  # written as the string "nan": not the fixed format
    assert parse_step_line(nan) is None and parse_event_line(nan)["loss"] == "nan"
    older = json.dumps({"v": 1, "t": 1.5, "mono": 2.0, "rank": 0, "kind": "step", "step": 4})
    assert parse_step_line(older.encode()) is None
    assert parse_event_line(older.encode()) == json.loads(older)
    assert parse_event_line(step_line()[:-9]) is None  # torn: neither parser takes it
    bad = step_line().replace(b'"t":1795705630.046983', b'"t":1e5e5')
    assert parse_step_line(bad) is None and parse_event_line(bad) is None
