"""The registry of checks, in report order.

A check is declared with the `@check` decorator in one module per group; `all_checks()` imports the
group modules in GROUPS order, so reports always list groups, and checks within a group, in the
same order whatever order they finished in.
"""

from __future__ import annotations

import importlib
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from ddpdoctor.checks.context import CheckContext
from ddpdoctor.checks.model import CheckOutcome, CheckResult, Status
from ddpdoctor.errors import UsageError

# Report order, and the module that declares each group's checks.
GROUPS: tuple[tuple[str, str], ...] = (
    ("launcher", "ddpdoctor.checks.launcher"),
    ("gpu", "ddpdoctor.checks.gpu"),
    ("nccl", "ddpdoctor.checks.nccl"),
    ("network", "ddpdoctor.checks.network"),
    ("rendezvous", "ddpdoctor.checks.rendezvous"),
    ("system", "ddpdoctor.checks.system"),
    ("smoke", "ddpdoctor.checks.smoke"),
)
GROUP_TITLES = {
    "launcher": "Launcher and environment",
    "gpu": "GPUs",
    "nccl": "NCCL",
    "network": "Network",
    "rendezvous": "Rendezvous",
    "system": "System",
    "smoke": "Collective smoke test",
    "script": "Script checkup",  # not a registered check: ddpdoctor.checks.scriptcheck, with --script
}

CheckFunc = Callable[[CheckContext], CheckOutcome]


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    func: CheckFunc
    timeout_s: float = 5.0
    slow: bool = False  # shown by the spinner; skipped by --no-smoke when in the smoke group

    @property
    def group(self) -> str:
        return self.id.split(".", 1)[0]

    def __call__(self, ctx: CheckContext) -> CheckResult:
        """Run the check on its own. A check that raises becomes an `error` result, never a crash."""
        start = time.monotonic()
        try:
            outcome = self.func(ctx)
            if not isinstance(outcome, CheckOutcome):
                raise TypeError(f"check returned {type(outcome).__name__}, not an CheckOutcome")
        except Exception as exc:  # noqa: BLE001 - a broken check must not break the doctor
            return self.error_result(
                f"the check itself failed: {type(exc).__name__}: {exc}",
                details=tuple(traceback.format_exception(exc)[-3:]),
                duration_s=time.monotonic() - start,
            )
        return CheckResult(
            id=self.id,
            group=self.group,
            title=self.title,
            status=outcome.status,
            summary=outcome.summary,
            details=outcome.details,
            fix=outcome.fix,
            facts=outcome.facts,
            duration_s=time.monotonic() - start,
        )

    def error_result(
        self, summary: str, *, details: tuple[str, ...] = (), duration_s: float = 0.0
    ) -> CheckResult:
        return CheckResult(
            id=self.id,
            group=self.group,
            title=self.title,
            status=Status.ERROR,
            summary=summary,
            details=details,
            fix="This is a bug or an environment ddpdoctor does not handle yet: rerun with "
            "--debug and report the details.",
            duration_s=duration_s,
        )


_REGISTRY: dict[str, Check] = {}


def check(
    id: str, title: str, *, timeout_s: float = 5.0, slow: bool = False
) -> Callable[[CheckFunc], Check]:
    """Declare a check. The id's prefix before the first dot is its group."""
    group = id.split(".", 1)[0]
    if group not in GROUP_TITLES:
        raise ValueError(f"check {id!r}: unknown group {group!r}")

    def register(func: CheckFunc) -> Check:
        if id in _REGISTRY:
            raise ValueError(f"check {id!r} registered twice")
        spec = Check(id=id, title=title, func=func, timeout_s=timeout_s, slow=slow)
        _REGISTRY[id] = spec
        return spec

    return register


def all_checks() -> list[Check]:
    """Every registered check in report order (imports the group modules on first call)."""
    for _, module in GROUPS:
        importlib.import_module(module)
    order = {group: i for i, (group, _) in enumerate(GROUPS)}
    indexed = list(enumerate(_REGISTRY.values()))
    return [c for _, c in sorted(indexed, key=lambda pair: (order[pair[1].group], pair[0]))]


def get_check(check_id: str) -> Check:
    checks = {c.id: c for c in all_checks()}
    return checks[check_id]


class UnknownCheckError(UsageError, KeyError):
    """A check id or group that does not exist: exit code 2, with where to look."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown check or group {self.name!r} (see 'ddpdoctor doctor --list-checks')"


def select_checks(ids: list[str] | None, *, smoke: bool = True) -> list[Check]:
    """The checks to run: all (minus the smoke group with smoke=False), or those named.

    A name may be a check id ("network.master_port") or a group ("network"). An unknown name
    raises UnknownCheckError (a usage error, and a KeyError carrying the name).
    """
    checks = all_checks()
    if not ids:
        return [c for c in checks if smoke or c.group != "smoke"]
    chosen: list[Check] = []
    for name in ids:
        matched = [c for c in checks if c.id == name or c.group == name]
        if not matched:
            raise UnknownCheckError(name)
        chosen.extend(c for c in matched if c not in chosen)
    order = {c.id: i for i, c in enumerate(checks)}
    return sorted(chosen, key=lambda c: order[c.id])
