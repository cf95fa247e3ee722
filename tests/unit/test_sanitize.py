"""One sanitizer for every text ddpdoctor writes to a terminal, tested at each entry point with
text that carries terminal control sequences (clipboard write, title, link, clear screen)."""

from __future__ import annotations

import io
from dataclasses import dataclass

from ddpdoctor.cli import main
from ddpdoctor.console import Verbatim, error_line, make_console, sanitize, sanitize_tree
from ddpdoctor.findings import Evidence, Finding, Severity
from ddpdoctor.monitor.tell.headless import HeadlessView

CLIPBOARD = "\x1b]52;c;ZXZpbA==\x07"
TITLE = "\x1b]0;pwned\x07"
LINK = "\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\"
CLEAR = "\x1b[2J\x1b[H"
C1_CSI = "\x9b2J"
EVIL = f"boom {CLIPBOARD}{TITLE}{LINK}{CLEAR}{C1_CSI} [link=http://evil.example]x[/link]"


def assert_inert(text: str) -> None:
    """Nothing a terminal would act on: no ESC, BEL or one-byte CSI/OSC; the codes shown as text."""
    for char in ("\x1b", "\x07", "\x9b", "\x9d"):
        assert char not in text, repr(text)
    assert "\\x1b]52;c;ZXZpbA==" in text


def test_sanitize_shows_control_characters_escaped_and_keeps_the_rest():
    assert sanitize("plain text, tabs\tand\nnewlines") == "plain text, tabs\tand\nnewlines"
    assert sanitize(CLIPBOARD) == "\\x1b]52;c;ZXZpbA==\\x07"
    assert sanitize(C1_CSI) == "\\x9b2J"
    assert sanitize("\x7f\x00") == "\\x7f\\x00"


@dataclass(frozen=True)
class _Leaf:
    text: str
    n: int = 0


def test_sanitize_tree_rebuilds_only_what_holds_control_characters():
    clean = (_Leaf("ok"), ["a"], {"k": "v"}, frozenset({"x"}))
    assert sanitize_tree(clean) is clean
    dirty = {"key": (_Leaf(CLIPBOARD, 3), [TITLE]), "n": 1}
    out = sanitize_tree(dirty)
    assert out["key"][0] == _Leaf("\\x1b]52;c;ZXZpbA==\\x07", 3)
    assert out["key"][1] == ["\\x1b]0;pwned\\x07"]
    assert dirty["key"][0].text == CLIPBOARD  # the original is left alone


def test_console_output_is_sanitized_but_verbatim_job_lines_pass_through():
    stream = io.StringIO()
    console = make_console(stream)
    console.print(EVIL, markup=False)
    console.print(f"[bold]{sanitize('x')}[/bold] {EVIL}")  # with markup as well
    console.print(Verbatim("job's own \x1b[32mgreen\x1b[0m line"))
    lines = stream.getvalue().splitlines()
    assert_inert(lines[0])
    assert_inert(lines[1])
    assert lines[2] == "job's own \x1b[32mgreen\x1b[0m line"


def test_error_line_is_sanitized():
    assert_inert(error_line(f"cannot read {EVIL}"))


def test_explain_shows_log_text_escaped(tmp_path, capsys):
    log = tmp_path / "rank.log"
    log.write_text(f"NCCL WARN {EVIL}\n[rank1]: RuntimeError: {EVIL}\n")
    main(["explain", str(log)])
    assert_inert(capsys.readouterr().out)


def test_doctor_shows_a_crafted_master_addr_escaped(monkeypatch, capsys):
    monkeypatch.setenv("MASTER_ADDR", f"host{CLIPBOARD}")
    monkeypatch.setenv("MASTER_PORT", "29500")
    main(["doctor", "--no-smoke", "launcher.env", "network.master_addr"])
    out = capsys.readouterr().out
    assert "MASTER_ADDR" in out
    assert_inert(out)


def test_the_diagnosis_text_of_run_and_watch_is_sanitized():
    from tests.tui.canned import crash_snapshot

    snap = crash_snapshot()
    evil = Finding(
        id="python.exception",
        severity=Severity.ERROR,
        summary=f"rank 3 raised {EVIL}",
        fix=f"look at {EVIL}",
        ranks=(3,),
        evidence=(Evidence(f"RuntimeError: {EVIL}", "logs/3/stderr.log", 2),),
    )
    from dataclasses import replace

    snap = replace(snap, findings=(evil, *snap.findings))
    for live in (False, True):
        stream = io.StringIO()
        view = HeadlessView(make_console(stream), live=live)
        view.update(snap)
        view.close(snap)
        assert_inert(stream.getvalue())
