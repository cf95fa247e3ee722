"""Post-mortems of real jobs: `ddpdoctor explain` of the flight-recorder dumps that plain torchrun
jobs (no ddpdoctor) leave at the failure point, and `ddpdoctor report` of a real hang run."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ddpdoctor.exit_codes import ExitCode
from tests.procs import PYTHON, REPO, clean_env, ddpdoctor_cmd, run

pytestmark = pytest.mark.integration

RECORD = REPO / "tests" / "fixtures" / "flight_recorder" / "record_dumps.py"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """Two plain 2-rank torchrun jobs, run at once: a hang at all_reduce #6 (rank 1 stuck, only
    rank 0 dumps) and a rank that exits before #6 (rank 0 fails in it and dumps)."""
    out = tmp_path_factory.mktemp("fr-jobs")
    done = run([PYTHON, str(RECORD), str(out), "hang", "exited"], timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def explain_json(*paths: Path) -> list[dict]:
    done = run(ddpdoctor_cmd("explain", "--json", *map(str, paths)), timeout=60)
    assert done.returncode == ExitCode.PROBLEMS, done.stderr
    return json.loads(done.stdout)["findings"]


def test_a_real_hang_dump_names_the_rank_behind_and_the_wait(recorded):
    (head,) = [f for f in explain_json(recorded / "hang") if f["severity"] == "error"]
    assert head["id"] == "fr.never_reached" and head["ranks"] == [1]
    match = re.match(
        r"rank 1 never reached all_reduce #6: rank 0 waits in it \((\d+\.\d) s when dumped\)",
        head["summary"],
    )
    assert match, head["summary"]
    assert 1.5 <= float(match.group(1)) <= 60  # dumped 1.8 s into the call (its timeout: 3 s)


def test_a_real_dump_and_its_logs_tell_one_story(recorded):
    findings = explain_json(recorded / "exited")
    assert [f["severity"] for f in findings].count("error") == 1
    head = findings[0]
    assert head["id"] == "fr.never_reached" and head["ranks"] == [1]
    assert "all_reduce #6" in head["summary"]
    assert all(f["severity"] != "error" for f in findings[1:])


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.external: list[str] = []
        self.ids: dict[str, str] = {}
        self._open: list[str] = []
        self.text: dict[str, list[str]] = {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("src", "href"):
            if tag in ("script", "link", "img") and attrs.get(key):
                self.external.append(attrs[key])
        if attrs.get("id"):
            self._open.append(attrs["id"])
            self.text.setdefault(attrs["id"], [])

    def handle_data(self, data):
        for name in self._open:
            self.text[name].append(data)

    def handle_endtag(self, tag):
        if tag in ("p", "div") and self._open:
            self._open.pop()


def test_report_of_a_real_hang_shows_it_and_the_trace_has_a_track_per_rank(shared_runs, tmp_path):
    hang = shared_runs.get("hang")
    page, trace = tmp_path / "report.html", tmp_path / "trace.json"
    done = run(
        ddpdoctor_cmd("report", str(hang.run_dir), "-o", str(page), "--trace", str(trace)),
        timeout=120,
    )
    assert done.returncode == ExitCode.OK, done.stderr
    html = page.read_text()
    parsed = _Page()
    parsed.feed(html)
    assert parsed.external == []  # self-contained: plotly.js inline, nothing fetched
    assert "".join(parsed.text["verdict"]).strip().lower().startswith("hang")
    findings = "".join(parsed.text["findings"])
    assert "never reached" in findings and 'data-id="hang"' in html
    assert "waiting in a collective" in html or "no progress (hang culprit)" in html

    document = json.loads(trace.read_text())
    events = document["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert sorted(names) == [0, 1] and names[1].startswith("rank 1")
    for rank in (0, 1):
        spans = [e for e in events if e["ph"] == "X" and e["tid"] == rank]
        assert any(e["cat"] == "step" for e in spans)
        assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in spans)
    assert any(e["cat"] in ("wait", "stalled") for e in events if e["ph"] == "X")


def test_report_of_what_is_not_a_run_directory_is_one_error_line(tmp_path):
    done = run(ddpdoctor_cmd("report", str(tmp_path)), timeout=60, env=clean_env())
    assert done.returncode == ExitCode.USAGE and done.stdout == ""
    assert done.stderr.startswith("ddpdoctor: error: not a run directory")
    assert done.stderr.count("\n") == 1
