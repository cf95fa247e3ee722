"""`ddpdoctor explain` in-process: text and JSON output, exit codes, one-line errors."""

from __future__ import annotations

import io
import json
import sys

from ddpdoctor import cli
from ddpdoctor.exit_codes import ExitCode
from tests.conftest import FIXTURES

HEALTHY = FIXTURES / "01-healthy-init-2gpu-p2p-nccl-2.15.log"
SIGKILL = FIXTURES / "30-torchrun-childfailederror-sigkill.log"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["explain", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_is_the_documented_document_and_nothing_else(capsys):
    code, out, err = run(capsys, "--json", str(SIGKILL), str(HEALTHY))
    assert code == ExitCode.PROBLEMS and err == ""
    document = json.loads(out)
    assert set(document) == {"schema_version", "findings"} and document["schema_version"] == 1
    first = document["findings"][0]
    assert set(first) == {"id", "severity", "summary", "fix", "ranks", "evidence"}
    assert (first["id"], first["severity"], first["ranks"]) == ("torchrun.killed", "error", [0])
    assert first["evidence"][0] == {
        "file": str(SIGKILL),
        "line": 14,
        "text": "  exitcode  : -9 (pid: 14750)",
    }
    severities = [f["severity"] for f in document["findings"]]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)


def test_a_healthy_log_exits_0(capsys):
    code, out, _ = run(capsys, "--json", str(HEALTHY))
    assert code == ExitCode.OK
    assert {f["severity"] for f in json.loads(out)["findings"]} <= {"warning", "info"}


def test_text_shows_symbol_summary_ranks_fix_evidence_and_a_closing_line(capsys):
    code, out, _ = run(capsys, str(SIGKILL))
    assert code == ExitCode.PROBLEMS
    lines = out.splitlines()
    assert lines[0].startswith("✗ error: Rank 0 (pid 14750") and lines[0].endswith(
        "[torchrun.killed]"
    )
    assert "    rank: 0" in lines
    assert any(line.startswith("    fix: Check `dmesg") for line in lines)
    assert f"    {SIGKILL.relative_to(FIXTURES.parent.parent.parent)}:14:   exitcode" in out
    assert lines[-1].startswith("Summary: 1 error, 0 warnings, 0 info in 1 file, 17 lines read")
    assert "\x1b[" not in out  # no colour without a terminal


def test_text_on_an_ascii_stream_never_crashes(capsys, monkeypatch):
    stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", stream)
    code = cli.main(["explain", str(FIXTURES / "local" / "gloo-peer-closed-rank0.log")])
    stream.flush()
    text = stream.buffer.getvalue().decode("ascii")
    assert code == ExitCode.PROBLEMS
    assert text.startswith("x error: A gloo peer")
    assert "before repor...\n" in text and "read - problems found" in text


def test_no_findings_says_so(capsys, tmp_path):
    quiet = tmp_path / "quiet.log"
    quiet.write_text("epoch 1 loss 0.3\nepoch 2 loss 0.2\n")
    code, out, _ = run(capsys, str(quiet))
    assert code == ExitCode.OK
    assert (
        out.strip()
        == "Summary: 0 errors, 0 warnings, 0 info in 1 file, 2 lines read — no errors found (exit 0)"
    )


def test_a_missing_file_is_one_line_and_exit_2(capsys, tmp_path):
    code, out, err = run(capsys, str(HEALTHY), str(tmp_path / "missing.log"))
    assert code == ExitCode.USAGE and out == ""
    assert err.strip().splitlines() == [
        f"ddpdoctor: error: cannot read {tmp_path / 'missing.log'}: no such file or directory"
    ]


def test_no_file_at_all_is_a_usage_error(capsys):
    code, _, err = run(capsys)
    assert code == ExitCode.USAGE and err.startswith("ddpdoctor: error: ")


def test_after_a_stop_store_and_peer_errors_are_consequences_and_others_stay():
    from ddpdoctor.findings import Finding, Severity
    from ddpdoctor.monitor.pipeline.postmortem import without_ddpdoctors_own_stop

    run_dir = str(FIXTURES / "local" / "run-stopped-multinode")
    sigterm = Finding("torchrun.signal", Severity.ERROR, "rank 1 died of SIGTERM", "", (1,))
    store = Finding("c10d.connect_timeout", Severity.ERROR, "the store timed out", "", (1,))
    oom = Finding("python.cuda_oom", Severity.ERROR, "CUDA out of memory", "", (0,))
    kept = without_ddpdoctors_own_stop([sigterm, store, oom], [run_dir])
    assert [(f.id, f.severity) for f in kept] == [
        ("run.diagnosis", Severity.ERROR),
        ("python.cuda_oom", Severity.ERROR),  # not something a stop causes: still an error
        ("c10d.connect_timeout", Severity.INFO),
    ]
    assert kept[2].summary == "after ddpdoctor stopped the job (a consequence): the store timed out"
    # the same findings outside a stopped run's directory are left as they are
    assert without_ddpdoctors_own_stop([sigterm, store], [str(FIXTURES)]) == [sigterm, store]
