"""Network facts: interfaces, name resolution, binds and connects (each bounded in time)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NetInterface:
    name: str
    up: bool
    ipv4: tuple[str, ...] = ()
    ipv6: tuple[str, ...] = ()

    @property
    def addresses(self) -> tuple[str, ...]:
        return self.ipv4 + self.ipv6


class RealNetProbe:
    def interfaces(self) -> list[NetInterface]:
        """Every network interface with its state and addresses (psutil; no subprocess)."""
        import socket

        import psutil

        stats = psutil.net_if_stats()
        result = []
        for name, addrs in sorted(psutil.net_if_addrs().items()):
            v4 = tuple(a.address for a in addrs if a.family == socket.AF_INET)
            v6 = tuple(a.address for a in addrs if a.family == socket.AF_INET6)
            up = bool(stats[name].isup) if name in stats else False
            result.append(NetInterface(name=name, up=up, ipv4=v4, ipv6=v6))
        return result
