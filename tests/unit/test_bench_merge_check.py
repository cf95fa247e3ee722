"""benchmarks/merge_check.py holds a faster merge to what node 0 said before: each poll's outcome
recorded, and any difference found, down to one rank's view."""

from __future__ import annotations

import json

from tests.procs import load_script


def _check():
    return load_script("benchmarks/merge_check.py")


def test_a_recording_compares_equal_and_names_what_changed(tmp_path, capsys):
    check = _check()
    cache, recording = tmp_path / "cache", tmp_path / "polls.jsonl"
    assert check.main(["--ranks", "32", "--cache", str(cache), "--record", str(recording)]) == 0
    lines = [json.loads(text) for text in recording.read_text().splitlines()]
    verdicts = [line["verdict"] for line in lines]
    assert verdicts[0] == "running" and verdicts[-1] == "hang"  # healthy polls, then the hang
    assert check.main(["--ranks", "32", "--cache", str(cache), "--compare", str(recording)]) == 0
    assert "polls equal" in capsys.readouterr().out

    lines[-1]["views"]["17"] = "another view"
    recording.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert check.main(["--ranks", "32", "--cache", str(cache), "--compare", str(recording)]) == 1
    said = capsys.readouterr().out
    assert f"poll {len(lines) - 1} " in said and "['17']" in said

    recording.write_text("".join(json.dumps(line) + "\n" for line in lines[:-1]))
    assert check.main(["--ranks", "32", "--cache", str(cache), "--compare", str(recording)]) == 2
    assert "ddpdoctor: error: the recording has" in capsys.readouterr().err

    recording.write_text("not a recording\n")
    assert check.main(["--ranks", "32", "--cache", str(cache), "--compare", str(recording)]) == 2
    assert "ddpdoctor: error: cannot read the recording" in capsys.readouterr().err
