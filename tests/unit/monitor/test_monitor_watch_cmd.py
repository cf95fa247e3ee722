from __future__ import annotations

import json

from ddpdoctor.cli import main
from tests.unit.monitor.test_monitor_builders import Stream
from tests.unit.monitor.test_monitor_diagnose import hung_stream


def healthy_run(tmp_path):
    s = Stream()
    s.hello(host="another-machine")
    t = s.steps(4)
    for r in range(2):
        s.ev(r, t + 0.1, "exit", code=0, reason="normal")
    return s.write(tmp_path / "healthy")


def test_json_prints_the_diagnosis_document_and_exits_with_the_verdict(tmp_path, capsys):
    run = hung_stream().write(tmp_path / "hung")
    assert main(["watch", str(run), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 1 and doc["verdict"] == "hang" and doc["culprits"] == [1]
    assert {"ranks", "findings", "stacks", "detected_after_s"} <= doc.keys()
    rank0 = doc["ranks"][0]
    assert rank0["state"] == "waiting" and rank0["collective"]["op"] == "all_reduce"
    assert rank0["collective"]["seq"] == 6 and rank0["collective"]["waiting_s"] > 5
    assert json.loads((run / "diagnosis.json").read_text())["verdict"] == "hang"


def test_hang_after_override(tmp_path, capsys):
    run = hung_stream().write(tmp_path / "hung")
    assert main(["watch", str(run), "--json", "--hang-after", "60"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "running"


def test_text_of_a_finished_healthy_run(tmp_path, capsys):
    run = healthy_run(tmp_path)
    assert main(["watch", str(run), "--no-tui"]) == 0
    out = capsys.readouterr().out
    assert "HEALTHY: all 2 ranks finished" in out and "diagnosis written to" in out


def test_text_of_a_hung_run(tmp_path, capsys):
    run = hung_stream().write(tmp_path / "hung")
    assert main(["watch", str(run), "--no-tui"]) == 1
    out = capsys.readouterr().out
    assert "HANG: culprit rank 1" in out and "rank 1 never reached all_reduce #6" in out


def test_not_a_run_directory_is_a_usage_error(tmp_path, capsys):
    assert main(["watch", str(tmp_path / "missing"), "--no-tui"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ddpdoctor: error: not a run directory") and "\n" not in err
