"""Doctor's inputs (flags and environment values) that are not what they claim to be: one clear
usage error, or a failed check with a fix; never a crashed check or a wrong "ready"."""

from __future__ import annotations

import json

import pytest

from ddpdoctor.cli import main


def doctor(capsys, *args: str) -> tuple[int, dict]:
    code = main(["doctor", "--no-smoke", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def result(doc: dict, check_id: str) -> dict:
    return next(r for r in doc["results"] if r["id"] == check_id)


def test_a_device_as_the_rendezvous_file_fails_and_is_never_to_be_removed(capsys):
    code, doc = doctor(capsys, "--init-method", "file:///dev/null", "rendezvous.file")
    found = result(doc, "rendezvous.file")
    assert code == 1 and found["status"] == "fail"
    assert "device or special file" in found["summary"]
    assert "rm -f" not in found["fix"]


def test_a_file_name_too_long_is_not_new(capsys, tmp_path):
    name = tmp_path / ("a" * 5000)
    code, doc = doctor(capsys, "--init-method", f"file://{name}", "rendezvous.file")
    found = result(doc, "rendezvous.file")
    assert code == 1 and found["status"] == "fail"
    assert "File name too long" in found["summary"]


def test_a_world_size_no_process_group_takes_is_not_ready(capsys, monkeypatch):
    for name, value in {"WORLD_SIZE": "1" + "0" * 30, "RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "29500")
    code, doc = doctor(capsys, "launcher.env")
    found = result(doc, "launcher.env")
    assert code == 1 and found["status"] == "fail"
    assert "larger than init_process_group accepts" in found["summary"]


def test_a_ten_thousand_digit_port_is_a_failed_check_not_a_crash(capsys, monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "9" * 10_000)
    code, doc = doctor(capsys, "network.master_port")
    found = result(doc, "network.master_port")
    assert code == 1 and found["status"] == "fail"
    assert "check itself failed" not in found["summary"] and found["fix"]


@pytest.mark.parametrize("method", ["tcp://[::1", "tcp://[::1:29500"])
def test_an_init_method_that_is_no_url_is_a_usage_error(capsys, method):
    assert main(["doctor", "--no-smoke", "--init-method", method]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ddpdoctor: error: --init-method {method}: not a valid URL (Invalid IPv6 URL)"]
