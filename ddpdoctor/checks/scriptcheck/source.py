"""Loading a script: its text, its syntax tree, its ignore comments, and the local modules it imports.

Only `ast.parse` runs; the script itself never does. A local import (`import foo`,
`from foo import x`, `from . import foo`) is followed to `foo.py` or `foo/__init__.py` next to the
importing file, because tutorial code splits data and model helpers into such files.
"""

from __future__ import annotations

import ast
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

# `# ddpdoctor: ignore`, `# ddpdoctor: ignore[rule-a]`, `# ddpdoctor: ignore[rule-a, rule-b]`
_IGNORE = re.compile(r"#\s*ddpdoctor:\s*ignore(?:\[([^\]]*)\])?")
ALL_RULES = "*"


class ScriptLoadError(Exception):
    """The file cannot be read or parsed; `line` is set for a syntax error."""

    def __init__(self, path: str, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


@dataclass(frozen=True)
class SourceFile:
    path: str  # as given, or as found next to the importing script
    text: str
    tree: ast.Module
    lines: tuple[str, ...]
    ignores: dict[int, frozenset[str]] = field(default_factory=dict)

    def line_text(self, line: int) -> str:
        return self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""

    def ignored(self, line: int, rule: str) -> bool:
        rules = self.ignores.get(line)
        return rules is not None and (ALL_RULES in rules or rule in rules)


MAX_SCRIPT_BYTES = 16 << 20


def _read_script(path: str) -> bytes:
    """A regular file's bytes, at most MAX_SCRIPT_BYTES: a FIFO would block the open or the
    read, a device (/dev/zero) never ends (the package reads files itself: it imports only the
    shared vocabulary)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file: not read")
        raw = fh.read(MAX_SCRIPT_BYTES + 1)
    if len(raw) > MAX_SCRIPT_BYTES:
        raise ValueError(f"larger than {MAX_SCRIPT_BYTES >> 20} MiB: not a script")
    return raw


def load(path: str) -> SourceFile:
    try:
        raw = _read_script(path)
    except ValueError as exc:
        raise ScriptLoadError(path, f"{path}: {exc}") from None
    except OSError as exc:
        raise ScriptLoadError(path, f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ScriptLoadError(path, f"{path} is not UTF-8 text: {exc.reason}") from None
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        line = exc.lineno or 1
        raise ScriptLoadError(path, f"{path}:{line}: syntax error: {exc.msg}", line) from None
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, absurd nesting
        raise ScriptLoadError(path, f"{path}: cannot parse: {type(exc).__name__}") from None
    lines = tuple(text.splitlines())
    return SourceFile(path, text, tree, lines, _ignores(lines))


def _ignores(lines: tuple[str, ...]) -> dict[int, frozenset[str]]:
    found: dict[int, frozenset[str]] = {}
    for number, line in enumerate(lines, start=1):
        if "ddpdoctor" not in line:  # cheap pre-filter: most lines have no comment at all
            continue
        match = _IGNORE.search(line)
        if match is None:
            continue
        names = match.group(1)
        if names is None or not names.strip():
            found[number] = frozenset({ALL_RULES})
        else:
            found[number] = frozenset(n.strip() for n in names.split(",") if n.strip())
    return found


def local_imports(source: SourceFile) -> list[str]:
    """Paths of the modules next to `source` that it imports (existing files only)."""
    base = Path(source.path).parent  # not resolved: findings name files the way the user did
    names: list[str] = []
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level > 1:
                continue
            if node.module:
                names.append(node.module)
            elif node.level == 1:  # from . import foo, bar
                names.extend(alias.name for alias in node.names)
    found: list[str] = []
    for name in names:
        parts = name.split(".")
        for candidate in (
            base.joinpath(*parts).with_suffix(".py"),
            base.joinpath(*parts, "__init__.py"),
        ):
            if candidate.is_file() and str(candidate) not in found:
                found.append(str(candidate))
                break
    return found
