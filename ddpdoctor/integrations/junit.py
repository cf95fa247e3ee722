"""The doctor's report as JUnit XML, for CI systems that show test results (GitLab, Jenkins,
GitHub Actions reporters, Azure Pipelines).

One <testcase> per check, classname = the check's group, name = the check id. A failed check is a
<failure>, a check that could not run an <error>, a skipped one <skipped>, each carrying the
summary, the fix and the details. A warning passes (its text goes to <system-out>) unless the
report is strict, where it is a <failure> like `doctor --strict` says. The file is written
atomically: a CI job that reads it never sees half a file.
"""

from __future__ import annotations

import os
import re
import tempfile
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.checks.report import DoctorReport
from ddpdoctor.errors import UsageError

SUITE_NAME = "ddpdoctor doctor"
# Characters XML 1.0 cannot carry at all, even escaped (C0 controls but tab/newline/CR, surrogates,
# U+FFFE/U+FFFF). Log lines with ANSI colours or stray NULs would otherwise make the file invalid.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def check_junit_path(path: str | os.PathLike[str]) -> Path:
    """Fail early, with one clear line, when the report could not be written there."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise UsageError(f"--junit-xml {target}: is a directory")
    if not parent.is_dir():
        raise UsageError(f"--junit-xml {target}: no such directory {parent}")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--junit-xml {target}: cannot write in {parent}")
    return target


def write_junit(report: DoctorReport, path: str | os.PathLike[str]) -> None:
    target = check_junit_path(path)
    data = ET.tostring(build_junit(report), encoding="utf-8", xml_declaration=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.write(b"\n")
        os.replace(tmp, target)
    except OSError as exc:
        _remove(tmp)
        raise UsageError(f"--junit-xml {target}: {exc.strerror or exc}") from None
    except BaseException:
        _remove(tmp)
        raise


def build_junit(report: DoctorReport) -> ET.Element:
    counts = report.counts
    failures = counts["fail"] + (counts["warn"] if report.strict else 0)
    totals = {
        "tests": str(len(report.results)),
        "failures": str(failures),
        "errors": str(counts["error"]),
        "skipped": str(counts["skip"]),
        "time": f"{report.elapsed_s:.3f}",
    }
    root = ET.Element("testsuites", {"name": "ddpdoctor", **totals})
    suite = ET.SubElement(
        root,
        "testsuite",
        {
            "name": SUITE_NAME,
            **totals,
            "hostname": _clean(report.host),
            "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
        },
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in (
        ("ddpdoctor_version", report.version),
        ("exit_code", str(int(report.exit_code))),
        ("strict", "true" if report.strict else "false"),
    ):
        ET.SubElement(properties, "property", {"name": name, "value": _clean(value)})
    for result in report.results:
        suite.append(_testcase(result, strict=report.strict))
    return root


def _testcase(result: CheckResult, *, strict: bool) -> ET.Element:
    case = ET.Element(
        "testcase",
        {
            "classname": _clean(result.group),
            "name": _clean(result.id),
            "time": f"{result.duration_s:.3f}",
        },
    )
    body = _clean(_body(result))
    message = _clean(f"{result.title}: {result.summary}")
    if result.status == Status.FAIL or (strict and result.status == Status.WARN):
        element = ET.SubElement(case, "failure", {"message": message, "type": result.status.value})
        element.text = body
    elif result.status == Status.ERROR:
        element = ET.SubElement(case, "error", {"message": message, "type": "error"})
        element.text = body
    elif result.status == Status.SKIP:
        ET.SubElement(case, "skipped", {"message": message})
    if result.status == Status.WARN and not strict:
        ET.SubElement(case, "system-out").text = f"warning: {body}"
    elif result.status == Status.PASS and result.details:
        ET.SubElement(case, "system-out").text = body
    return case


def _body(result: CheckResult) -> str:
    lines = [result.summary]
    if result.fix:
        lines.append(f"fix: {result.fix}")
    lines.extend(result.details)
    return "\n".join(lines)


def _clean(text: str) -> str:
    """Text XML can hold; ElementTree escapes &, <, > and quotes itself."""
    return _NOT_XML.sub("\ufffd", str(text))


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
