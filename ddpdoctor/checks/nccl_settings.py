"""The NCCL settings a job will run with: its environment plus NCCL's configuration files.

NCCL reads NCCL_CONF_FILE (2.23+) or else ~/.nccl.conf, then /etc/nccl.conf; a file never
overrides a variable already set, so the environment wins, then the user's file, then the
system's. Files are read through the fs probe, so tests can supply them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpdoctor.checks.context import CheckContext

SYSTEM_CONF = "/etc/nccl.conf"
PREFIXES = ("NCCL_", "TORCH_NCCL_")


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    source: str  # "environment" or the configuration file's path

    @property
    def where(self) -> str:
        return "" if self.source == "environment" else f" (from {self.source})"


def conf_files(ctx: CheckContext) -> list[str]:
    """The configuration files NCCL would read, in order of precedence."""
    user = ctx.env.get("NCCL_CONF_FILE")
    files = []
    if user:
        files.append(user)
    elif ctx.env.get("HOME"):
        files.append(f"{ctx.env['HOME'].rstrip('/')}/.nccl.conf")
    files.append(SYSTEM_CONF)
    return files


def parse_conf(text: str) -> list[tuple[str, str]]:
    """NAME=value lines; `#` starts a comment; blank and malformed lines are skipped."""
    pairs = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" not in line:
            continue
        name, value = line.split("=", 1)
        if name.strip():
            pairs.append((name.strip(), value.strip()))
    return pairs


def read_conf_files(ctx: CheckContext) -> dict[str, str]:
    """The configuration files that exist, path -> text, in order of precedence."""
    found = {}
    for path in conf_files(ctx):
        text = ctx.probes.fs.read_text(path)
        if text is not None:
            found[path] = text
    return found


def nccl_settings(ctx: CheckContext) -> dict[str, Setting]:
    """Every NCCL_* / TORCH_NCCL_* setting in effect, by name, with where it came from."""
    settings = {
        name: Setting(name, value, "environment")
        for name, value in ctx.env.items()
        if name.startswith(PREFIXES)
    }
    for path, text in read_conf_files(ctx).items():
        for name, value in parse_conf(text):
            settings.setdefault(name, Setting(name, value, path))
    return settings


def setting_value(ctx: CheckContext, name: str) -> str | None:
    found = nccl_settings(ctx).get(name)
    return found.value if found else None
