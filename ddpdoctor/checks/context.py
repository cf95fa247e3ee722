"""What a check may look at: the environment, the options, the probes and the clock.

Checks never touch os.environ, NVML, sockets or the filesystem directly; they ask the context. Tests
build a context with `env={...}` and fake probes that return recorded facts (a multi-GPU machine, a
busy GPU, a port in use), so every check is a pure function of what it is given.

The probe interfaces live next to their real implementations in ddpdoctor/checks/probes/:
  gpu      GPU facts from NVML and the CUDA driver (probes/gpu.py)
  torch    what the installed torch offers, read without importing it where possible (probes/torch_facts.py)
  net      name resolution, binds, connects, interfaces (probes/net.py)
  fs       filesystem facts: writability, fs type, locking, statvfs (probes/fs.py)
  system   limits, cores, memory, py-spy, ptrace permission (probes/system.py)
  smoke    the multi-process collective smoke test (probes/smoke.py)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

from ddpdoctor.checks.plan import Plan, build_plan

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class DoctorOptions:
    """Command-line overrides; None means "take it from the environment"."""

    nproc: int | None = None
    nnodes: int | None = None
    backend: str = "auto"
    init_method: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    # Where master_addr/master_port came from when not from --master-addr/--master-port (e.g.
    # "--rdzv-endpoint" for `ddpdoctor run`), so a finding names the flag the user gave.
    address_flag: str | None = None
    smoke: bool = True
    workers: int | None = None  # DataLoader workers per rank, for the CPU budget check
    smoke_timeout_s: float = 60.0
    scripts: tuple[str, ...] = ()  # training scripts for the static checkup (group "script")
    # Set by `ddpdoctor run` for a one-node launch (torchrun --standalone), which picks a free
    # port itself: MASTER_PORT and torchrun's default 29500 are then never used.
    launcher_picks_port: bool = False


class Probes:
    """The probe set. Attributes not given are the real probes, created on first use.

    Lazy creation keeps `ddpdoctor doctor` fast: a probe module (and what it imports) is loaded only
    when a check asks for it.
    """

    _REAL: ClassVar[dict[str, tuple[str, str]]] = {
        "gpu": ("ddpdoctor.checks.probes.gpu", "RealGpuProbe"),
        "torch": ("ddpdoctor.checks.probes.torch_facts", "RealTorchProbe"),
        "net": ("ddpdoctor.checks.probes.net", "RealNetProbe"),
        "fs": ("ddpdoctor.checks.probes.fs", "RealFsProbe"),
        "system": ("ddpdoctor.checks.probes.system", "RealSystemProbe"),
        "smoke": ("ddpdoctor.checks.probes.smoke", "RealSmokeProbe"),
    }

    def __init__(self, **given: Any) -> None:
        unknown = set(given) - set(self._REAL)
        if unknown:
            raise TypeError(f"unknown probes: {sorted(unknown)}")
        self.__dict__.update(given)

    def __getattr__(self, name: str) -> Any:
        # Only called when the attribute is missing, i.e. the real probe was not created yet.
        if name not in self._REAL:
            raise AttributeError(name)
        import importlib

        module_name, class_name = self._REAL[name]
        probe = getattr(importlib.import_module(module_name), class_name)()
        self.__dict__[name] = probe
        return probe


@dataclass
class CheckContext:
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    options: DoctorOptions = field(default_factory=DoctorOptions)
    probes: Probes = field(default_factory=Probes)
    clock: Callable[[], float] = time.monotonic

    @cached_property
    def plan(self) -> Plan:
        o = self.options
        return build_plan(
            self.env,
            init_method=o.init_method,
            backend=o.backend,
            nproc=o.nproc,
            nnodes=o.nnodes,
            master_addr=o.master_addr,
            master_port=o.master_port,
        )
