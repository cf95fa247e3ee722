"""What the network and rendezvous checks derive from the plan and the probes: bounded name
resolution, kinds of addresses, port values as written, and whether this host is the master.

Name resolution goes through `bounded_call`, so a DNS server that never answers costs
RESOLVE_TIMEOUT_S, not a hung doctor.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlparse

from ddpdoctor.checks.context import CheckContext
from ddpdoctor.checks.model import CheckOutcome, failed
from ddpdoctor.checks.plan import DEFAULT_MASTER_PORT, LOOPBACK_NAMES
from ddpdoctor.checks.probes.bounded import bounded_call
from ddpdoctor.checks.probes.net import NetInterface, Resolution

RESOLVE_TIMEOUT_S = 2.0


def resolve(ctx: CheckContext, host: str) -> Resolution:
    """The probe's getaddrinfo, given RESOLVE_TIMEOUT_S at most."""
    result = bounded_call(lambda: ctx.probes.net.resolve(host), RESOLVE_TIMEOUT_S, name="resolve")
    if result.timed_out:
        return Resolution(host, error=f"no answer within {RESOLVE_TIMEOUT_S:g} s", timed_out=True)
    if result.error is not None:
        return Resolution(host, error=str(result.error))
    return result.value or Resolution(host, error="no result")


def is_loopback(address: str) -> bool:
    ip = _ip(address)
    if ip is None:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def is_link_local(address: str) -> bool:
    ip = _ip(address)
    return bool(ip is not None and ip.is_link_local)


def numeric_host_reading(host: str) -> str | None:
    """What an all-digit host name becomes: the C resolver reads "6841231" as the 32-bit IPv4
    number 0.104.99.143 (fixture 37). None when the name is not all digits."""
    if not host.isdigit():
        return None
    number = int(host)
    if number >= 1 << 32:
        return "no IPv4 address (too large), so it does not resolve"
    return str(ipaddress.IPv4Address(number))


def port_problem(port_text: str | None, port: int | None, label: str) -> CheckOutcome | None:
    """A failed CheckOutcome when the port text is not a usable TCP port, else None.

    `label` names where the value came from: "MASTER_PORT", "--master-port" or a tcp:// URL.
    """
    if port_text is None:
        return None
    shown = f"the port {port_text!r} of {label}" if "://" in label else f"{label}={port_text!r}"
    if port is not None:
        shown = shown.replace(repr(port_text), port_text)
    fix = f"Set {label if '://' not in label else 'the port in the URL'} to a free TCP port "
    fix += f"between 1024 and 65535, e.g. {DEFAULT_MASTER_PORT}."
    if port is None:
        return failed(f"{shown} is not a port number", fix=fix)
    if not 1 <= port <= 65535:
        return failed(f"{shown} is outside the TCP port range 1..65535", fix=fix)
    return None


def url_port_text(url: str) -> str | None:
    """The port text of a tcp://HOST:PORT URL as written (None when it names no port)."""
    netloc = urlparse(url).netloc
    host_end = netloc.rfind("]")  # [v6::addr]:port
    tail = netloc[host_end + 1 :] if host_end >= 0 else netloc
    return tail.rsplit(":", 1)[1] if ":" in tail else None


def master_port_text(ctx: CheckContext) -> tuple[str | None, int | None]:
    """The master port as written and as a number (None when it is not a number)."""
    plan = ctx.plan
    text = plan.master_port_text
    if plan.scheme == "tcp" and ctx.options.master_port is None:
        text = url_port_text(plan.init_method)
    if text is None:
        return None, None
    digits = text.strip()
    # int() of a 10,000-digit string raises; any port has at most 5 digits, so a longer one is
    # some number out of range (65536 stands for it)
    if not digits.isdigit():
        return text, None
    return text, int(digits) if len(digits) <= 5 else 65536


def port_label(ctx: CheckContext) -> str:
    if ctx.options.master_port is not None:
        return ctx.options.address_flag or "--master-port"
    if ctx.plan.scheme == "tcp":
        return ctx.plan.init_method
    if "MASTER_PORT" not in ctx.env and "PET_MASTER_PORT" in ctx.env:
        return "PET_MASTER_PORT"
    return "MASTER_PORT"


def addr_label(ctx: CheckContext) -> str:
    if ctx.options.master_addr is not None:
        return ctx.options.address_flag or "--master-addr"
    if ctx.plan.scheme == "tcp":
        return "the host of --init-method"
    if "MASTER_ADDR" not in ctx.env and "PET_MASTER_ADDR" in ctx.env:
        return "PET_MASTER_ADDR"
    return "MASTER_ADDR"


def local_addresses(ctx: CheckContext) -> frozenset[str]:
    return frozenset(a.split("%")[0] for i in ctx.probes.net.interfaces() for a in i.addresses)


def master_is_here(ctx: CheckContext, resolution: Resolution | None) -> bool:
    """Rank 0, a loopback master address, our own name, or an address of one of our interfaces.

    (Not Plan.is_master_host: its getfqdn() is a reverse lookup that a dead DNS server stalls.)
    """
    plan = ctx.plan
    said = rank_says_master(ctx)
    if said is not None:
        return said
    addr = (plan.master_addr or "").lower()
    if not addr or addr in LOOPBACK_NAMES or is_loopback(addr):
        return True
    if addr == ctx.probes.net.hostname().lower():
        return True
    mine = local_addresses(ctx)
    return addr in mine or (resolution is not None and bool(set(resolution.addresses) & mine))


def rank_says_master(ctx: CheckContext) -> bool | None:
    """RANK, else a pod's PET_NODE_RANK, says whether this host serves the store (rank 0's;
    node 0's under torchrun's static rendezvous); None when neither is set."""
    if ctx.plan.rank is not None:
        return ctx.plan.rank == 0
    if ctx.plan.node_rank is not None:
        return ctx.plan.node_rank == 0
    return None


def spans_hosts(ctx: CheckContext) -> bool:
    """The job runs on several machines: the launcher says so (nnodes), or MASTER_ADDR is an
    address of another machine (RANK=1 MASTER_ADDR=10.0.0.5 without NNODES still spans two)."""
    if ctx.plan.multi_node:
        return True
    addr = (ctx.plan.master_addr or "").lower()
    if not addr or addr in LOOPBACK_NAMES or is_loopback(addr):
        return False
    if addr == ctx.probes.net.hostname().lower():
        return False
    found = resolve(ctx, addr).addresses if _ip(addr) is None else (addr,)
    mine = local_addresses(ctx)
    return bool(found) and not (set(found) & mine) and not any(is_loopback(a) for a in found)


def routable_interfaces(interfaces: list[NetInterface]) -> list[NetInterface]:
    """Interfaces that are up with an address another node could reach (not loopback, not
    link-local)."""
    return [
        i
        for i in interfaces
        if i.up and any(not is_loopback(a) and not is_link_local(a) for a in i.addresses)
    ]


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None
