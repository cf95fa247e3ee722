"""Which network interfaces NCCL and gloo will use, following their own rules.

NCCL_SOCKET_IFNAME (NCCL's socket.cc): a comma list of name prefixes; a leading `^` turns the whole
list into exclusions, and `=` after it (or alone) asks for exact names (`^=docker0`). Values of one
character are ignored. Unset, NCCL tries `ib*`, then anything but `docker*` and `lo`, then `docker*`,
then `lo`. Only interfaces with an address of the allowed family count; IPv6 loopback never does.

GLOO_SOCKET_IFNAME (torch's ProcessGroupGloo): a comma list of exact interface names; no `^`, no
`=`, no addresses ("Unable to find address for: ^lo").
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from ddpdoctor.checks.probes.net import NetInterface
from ddpdoctor.checks.problems import Problem

NCCL_DEFAULT_ORDER = ("ib", "^docker,lo", "docker", "lo")
# Interfaces that exist only inside this host (containers, VMs, VPN tunnels): not routable
# between nodes, but NCCL's default filter only excludes docker* and lo (F15).
VIRTUAL_PREFIXES = (
    "veth", "br-", "docker", "virbr", "cni", "flannel", "tun", "tap", "cali", "weave",
    "vxlan", "kube-", "lxcbr", "lxdbr",
)  # fmt: skip


@dataclass(frozen=True)
class IfnameList:
    raw: str
    exclude: bool  # leading ^: use every interface that does NOT match
    exact: bool  # leading = (after ^): whole names instead of prefixes
    items: tuple[str, ...]
    misplaced: tuple[str, ...] = ()  # items with ^ or = inside the list: matched literally

    def matches(self, name: str) -> bool:
        if not self.items:
            hit = True  # NCCL: an empty list matches everything
        elif self.exact:
            hit = name in self.items
        else:
            hit = any(name.startswith(item) for item in self.items)
        return hit != self.exclude


def parse_ifname_list(raw: str) -> IfnameList:
    text = raw
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    exact = text.startswith("=")
    if exact:
        text = text[1:]
    # NCCL's list parser also accepts "name:port" (the port is for IB HCAs; ignored here).
    items = tuple(item.split(":", 1)[0] for item in text.split(",") if item)
    misplaced = tuple(item for item in items if item.startswith(("^", "=")))
    return IfnameList(raw, exclude, exact, items, misplaced)


def has_usable_address(iface: NetInterface, family: str | None = None) -> bool:
    """An address NCCL would bind: the family asked for (NCCL_SOCKET_FAMILY), not IPv6 loopback."""
    v4 = family in (None, "AF_INET") and bool(iface.ipv4)
    v6 = family in (None, "AF_INET6") and any(a.split("%")[0] != "::1" for a in iface.ipv6)
    return v4 or v6


def nccl_candidates(
    value: str | None, interfaces: Sequence[NetInterface], family: str | None = None
) -> tuple[list[NetInterface], str]:
    """The interfaces NCCL would pick, and the rule that picked them ("NCCL_SOCKET_IFNAME=eth",
    or "default: ^docker,lo")."""
    usable = [i for i in interfaces if has_usable_address(i, family)]
    if value is not None and len(value) > 1:
        spec = parse_ifname_list(value)
        return [i for i in usable if spec.matches(i.name)], f"NCCL_SOCKET_IFNAME={value}"
    for rule in NCCL_DEFAULT_ORDER:
        spec = parse_ifname_list(rule)
        chosen = [i for i in usable if spec.matches(i.name)]
        if chosen:
            return chosen, f"default: {rule}"
    return [], "default: no interface with an address"


def is_virtual(name: str) -> bool:
    return name.startswith(VIRTUAL_PREFIXES)


def is_link_local_only(iface: NetInterface) -> bool:
    """Only 169.254/16 or fe80::/10 addresses: not routable between hosts."""
    addresses = [a.split("%")[0] for a in iface.addresses]
    if not addresses:
        return False
    try:
        return all(ipaddress.ip_address(a).is_link_local for a in addresses)
    except ValueError:
        return False


def gloo_problems(value: str, interfaces: Sequence[NetInterface]) -> list[str]:
    """What is wrong with GLOO_SOCKET_IFNAME, one message per bad entry."""
    by_name = {i.name: i for i in interfaces}
    problems = []
    for token in value.split(","):
        name = token.strip()
        if not name:
            problems.append(f"GLOO_SOCKET_IFNAME={value!r} has an empty entry")
        elif name.startswith(("^", "=")):
            problems.append(
                f"{name!r}: gloo takes exact interface names; NCCL's ^ / = syntax fails with "
                f"'Unable to find address for: {name}'"
            )
        elif _looks_like_address(name):
            problems.append(f"{name!r} is an address; gloo needs an interface name")
        elif name not in by_name:
            problems.append(f"{name!r}: no such interface")
        elif not by_name[name].up:
            problems.append(f"{name!r} is down")
        elif not by_name[name].addresses:
            problems.append(f"{name!r} has no IP address")
    return problems


def _looks_like_address(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
        return True
    except ValueError:
        return text.count(".") == 3 and all(p.isdigit() for p in text.split(".") if p)


def nccl_ifname_problems(
    value: str | None,
    chosen: list[NetInterface],
    interfaces: list[NetInterface],
    good: str | None,
    uses_nccl: bool,
) -> list[Problem]:
    if value is None:
        return []
    suggestion = f"export NCCL_SOCKET_IFNAME={good}" if good else "unset NCCL_SOCKET_IFNAME"
    if len(value) <= 1:
        return [
            Problem(
                f"NCCL_SOCKET_IFNAME={value!r} is ignored (NCCL needs at least 2 characters)",
                fix=suggestion,
                fatal=False,
            )
        ]
    problems: list[Problem] = []
    spec = parse_ifname_list(value)
    if spec.misplaced:
        problems.append(
            Problem(
                f"NCCL_SOCKET_IFNAME entries {', '.join(spec.misplaced)} start with ^ or =, "
                "which NCCL reads only at the start of the whole list: they match nothing",
                fix="put ^ (exclude) or = (exact) once, first: e.g. NCCL_SOCKET_IFNAME=^docker,lo",
                fatal=False,
            )
        )
    available = ", ".join(i.name for i in interfaces) or "none"
    if not chosen:
        problems.append(
            Problem(
                f"NCCL_SOCKET_IFNAME={value} matches no interface with an address (here: "
                f"{available}): NCCL fails with 'Bootstrap : no socket interface found' (F14)",
                fix=suggestion,
                fatal=uses_nccl,
            )
        )
    down = [i.name for i in chosen if not i.up]
    if down:
        problems.append(
            Problem(
                f"NCCL_SOCKET_IFNAME={value} selects {', '.join(down)}, which "
                f"{'is' if len(down) == 1 else 'are'} down",
                fix=suggestion,
                fatal=uses_nccl and len(down) == len(chosen),
            )
        )
    return problems


def routable_choice(interfaces: list[NetInterface]) -> str | None:
    """The interface to suggest: up, with an address, not loopback, virtual or link-local."""
    for iface in interfaces:
        if (
            iface.up
            and iface.addresses
            and iface.name != "lo"
            and not is_virtual(iface.name)
            and not is_link_local_only(iface)
        ):
            return iface.name
    return None
