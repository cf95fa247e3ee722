"""Recorded machines (tests/fixtures/facts/*.json) and fake probes that replay them.

Each JSON file describes one real kind of machine as the probes see it: NVML's GPUs, the torch
install, torch's own answers, network interfaces and InfiniBand HCAs. `context()` builds a
CheckContext from one of them plus an environment, so a check runs exactly as it would there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.checks.context import CheckContext, DoctorOptions, Probes
from ddpdoctor.checks.probes.fs import DirStatus
from ddpdoctor.checks.probes.gpu import GpuFacts, IbDevice, ib_devices_from_json
from ddpdoctor.checks.probes.net import NetInterface
from ddpdoctor.checks.probes.torch_facts import TorchFacts, TorchRuntime
from tests.procs import REPO

FACTS_DIR = REPO / "tests" / "fixtures" / "facts"
MACHINES = sorted(p.stem for p in FACTS_DIR.glob("*.json"))


@dataclass(frozen=True)
class Machine:
    name: str
    description: str
    gpu: GpuFacts
    torch: TorchFacts
    runtime: TorchRuntime | None
    interfaces: tuple[NetInterface, ...]
    infiniband: tuple[IbDevice, ...]


def load_machine(name: str) -> Machine:
    data = json.loads((FACTS_DIR / f"{name}.json").read_text())
    runtime = data.get("torch_runtime")
    return Machine(
        name=name,
        description=data["description"],
        gpu=GpuFacts.from_json(data["gpu"]),
        torch=TorchFacts.from_json(data["torch"]),
        runtime=TorchRuntime.from_json(runtime) if runtime else None,
        interfaces=tuple(
            NetInterface(i["name"], i["up"], tuple(i["ipv4"]), tuple(i["ipv6"]))
            for i in data["interfaces"]
        ),
        infiniband=ib_devices_from_json(data["infiniband"]),
    )


class FakeGpuProbe:
    def __init__(self, facts: GpuFacts, infiniband: tuple[IbDevice, ...] = ()) -> None:
        self._facts, self._ib = facts, infiniband

    def facts(self) -> GpuFacts:
        return self._facts

    def infiniband(self) -> tuple[IbDevice, ...]:
        return self._ib


class FakeTorchProbe:
    """Replays torch facts; records every (expensive) runtime() call so tests can assert on it."""

    def __init__(self, facts: TorchFacts, runtime: TorchRuntime | None) -> None:
        self._facts, self._runtime = facts, runtime
        self.runtime_calls: list[dict[str, str]] = []

    def facts(self) -> TorchFacts:
        return self._facts

    def runtime(self, env: Mapping[str, str], timeout_s: float = 25.0) -> TorchRuntime:
        self.runtime_calls.append(dict(env))
        if self._runtime is None:
            raise AssertionError("torch's runtime view was asked for on a machine without GPUs")
        return self._runtime


class FakeNetProbe:
    def __init__(self, interfaces: tuple[NetInterface, ...]) -> None:
        self._interfaces = interfaces

    def interfaces(self) -> list[NetInterface]:
        return list(self._interfaces)


@dataclass
class FakeFsProbe:
    files: dict[str, str] = field(default_factory=dict)
    dirs: dict[str, DirStatus] = field(default_factory=dict)

    def read_text(self, path: str, limit: int = 65536) -> str | None:
        return self.files.get(path)

    def dir_status(self, path: str) -> DirStatus:
        return self.dirs.get(
            path,
            DirStatus(path, exists=False, is_dir=False, writable=False, error="does not exist"),
        )


def context(
    machine: str | Machine = "cpu-only",
    env: Mapping[str, str] | None = None,
    *,
    options: DoctorOptions | None = None,
    files: dict[str, str] | None = None,
    dirs: dict[str, DirStatus] | None = None,
    **overrides: Any,
) -> CheckContext:
    """A context for `machine` with `env` (default: empty) and fake probes; overrides replace
    parts of the machine: gpu=GpuFacts, torch=TorchFacts, runtime=..., interfaces=..."""
    m = machine if isinstance(machine, Machine) else load_machine(machine)
    gpu = overrides.get("gpu", m.gpu)
    probes = Probes(
        gpu=FakeGpuProbe(gpu, overrides.get("infiniband", m.infiniband)),
        torch=FakeTorchProbe(overrides.get("torch", m.torch), overrides.get("runtime", m.runtime)),
        net=FakeNetProbe(tuple(overrides.get("interfaces", m.interfaces))),
        fs=FakeFsProbe(files or {}, dirs or {}),
    )
    return CheckContext(
        env=dict(env or {}), options=options or DoctorOptions(smoke=False), probes=probes
    )


def writable(path: str) -> DirStatus:
    return DirStatus(path, exists=True, is_dir=True, writable=True)
