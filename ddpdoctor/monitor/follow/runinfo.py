"""RunInfo from run.json (what the launcher wrote), tolerant of missing keys and copied directories."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ddpdoctor.monitor.model.snapshot import RunInfo
from ddpdoctor.protocol.events import MAX_RANKS
from ddpdoctor.protocol.rundir import RunDir


def _first(data: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if data.get(key) is not None:
            return data[key]
    return None


def _int(value: Any, bound: int | None = None) -> int | None:
    """An integer of run.json; `bound`: a count (ranks, nodes), which must lie in 1..bound
    (a file's number allocates nothing: a larger one is no count of a launch)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isdigit() and len(value) <= 18:
        value = int(value)
    if not isinstance(value, int):
        return None
    if bound is not None and not 0 < value <= bound:
        return None
    return value


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def run_info(run: RunDir, data: dict[str, Any] | None = None) -> RunInfo:
    data = run.read_run_json() if data is None else data
    command = _first(data, "command", "argv", "torchrun_cmd")
    if isinstance(command, str):
        command = command.split()
    hosts = _first(data, "hosts")
    if isinstance(hosts, str):
        hosts = [hosts]
    elif not isinstance(hosts, list):
        host = _first(data, "host")
        hosts = [host] if isinstance(host, str) else []
    return RunInfo(
        name=str(_first(data, "name", "run_name") or run.path.name),
        run_dir=str(run.path),
        world_size=_int(_first(data, "world_size"), 1 << 62),
        backend=_first(data, "backend") if isinstance(_first(data, "backend"), str) else None,
        hosts=tuple(str(h) for h in hosts),
        started_t=_float(_first(data, "started_t", "start_time", "started", "start_t")),
        command=tuple(str(c) for c in command) if isinstance(command, list) else (),
        nnodes=_int(_first(data, "nnodes"), MAX_RANKS),
        total_steps=_int(_first(data, "total_steps", "steps")),
        launch_mode=data.get("launch_mode") if isinstance(data.get("launch_mode"), str) else None,
    )


def recorded_hang_after(data: dict[str, Any]) -> float | None:
    """The --hang-after the launcher ran with, when it recorded one."""
    value = _float(data.get("hang_after"))
    return value if value and value > 0 else None


def with_nodes(info: RunInfo, records: Mapping[int, Any]) -> RunInfo:
    """RunInfo with the hosts of every node's launcher (run.json names only the node that wrote
    it) and at least as many nodes as launchers recorded (ddpdoctor.protocol.node_records)."""
    if not records:
        return info
    hosts = list(info.hosts)
    for node in sorted(records):
        host = getattr(records[node], "host", None)
        if isinstance(host, str) and host not in hosts:
            hosts.append(host)
    nnodes = max(info.nnodes or 0, len(records))
    return replace(info, hosts=tuple(hosts), nnodes=nnodes)
