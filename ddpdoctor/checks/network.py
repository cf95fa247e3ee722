"""Network checks: the master's port and address, this host's name, and the interfaces.

Failure modes F09 (port in use), F10 (master unresolvable, unreachable or mis-parsed) and F12
(hostname on loopback) in the catalog. Name resolution and connects are bounded in time
(ddpdoctor.checks.net_facts, bounded_call), so a dead DNS server or a silent firewall cannot hang
the doctor.
"""

from __future__ import annotations

from ddpdoctor.checks import net_facts
from ddpdoctor.checks.context import CheckContext
from ddpdoctor.checks.model import CheckOutcome, failed, passed, skipped, warning
from ddpdoctor.checks.net_facts import (
    is_link_local,
    is_loopback,
    master_is_here,
    master_port_text,
    numeric_host_reading,
    port_problem,
    resolve,
    routable_interfaces,
    spans_hosts,
)
from ddpdoctor.checks.plan import DEFAULT_MASTER_PORT
from ddpdoctor.checks.probes.bounded import bounded_call
from ddpdoctor.checks.probes.net import ConnectResult
from ddpdoctor.checks.registry import check

CONNECT_TIMEOUT_S = 2.0
STORE_SCHEMES = ("env", "tcp")  # the init methods that use a master address and port


def _skip_for_scheme(ctx: CheckContext) -> CheckOutcome | None:
    scheme = ctx.plan.scheme
    if scheme == "file":
        return skipped("file:// rendezvous uses no master address or port")
    if scheme not in STORE_SCHEMES:
        return skipped(
            f"init method {ctx.plan.init_method!r} is not env:// or tcp:// "
            "(see rendezvous.init_method)"
        )
    return None


# --- checks ---------------------------------------------------------------------------------------


@check("network.master_port", "Master port", timeout_s=10.0)
def master_port(ctx: CheckContext) -> CheckOutcome:
    skip = _skip_for_scheme(ctx)
    if skip:
        return skip
    if ctx.options.launcher_picks_port:
        return passed(
            "the launch picks a free port itself (torchrun --standalone): "
            "MASTER_PORT and the default 29500 are not used",
            facts={"port": None, "source": "standalone"},
        )
    plan, label = ctx.plan, net_facts.port_label(ctx)
    port_text, port_number = master_port_text(ctx)
    problem = port_problem(port_text, port_number, label)
    if problem:
        return problem
    port = port_number if port_number is not None else DEFAULT_MASTER_PORT
    note = (
        ()
        if port_text is not None
        else (f"MASTER_PORT is not set: checked torchrun's default {DEFAULT_MASTER_PORT}",)
    )
    facts = {"port": port, "source": label if port_text is not None else "default"}
    # looked up only when the rank does not say (a DNS server that never answers costs 2 s)
    known = net_facts.rank_says_master(ctx) is not None
    resolution = resolve(ctx, plan.master_addr) if plan.master_addr and not known else None
    if not master_is_here(ctx, resolution):
        return passed(
            f"port {port} is valid; the master {plan.master_addr} listens on it "
            "(see Master address)",
            details=note,
            facts={**facts, "master_here": False},
        )
    bind = ctx.probes.net.bind_test(port)
    facts.update(
        master_here=True,
        bind={a.address: "ok" if a.ok else a.error for a in bind.attempts},
    )
    if bind.free:
        return passed(f"port {port} is free on this host (the master)", details=note, facts=facts)
    free = ctx.probes.net.free_port()
    if bind.in_use:
        owners = ctx.probes.net.port_owners(port)
        ours = ctx.probes.net.ancestor_pids() if _inside_a_launched_job(ctx) else frozenset()
        if owners and all(o.pid in ours for o in owners):
            return passed(
                f"port {port} is held by {owners[0].describe()}, which started this process "
                "(the job's own store)",
                details=note,
                facts={**facts, "owners": [o.pid for o in owners]},
            )
        facts["owners"] = [
            {"pid": o.pid, "command": " ".join(o.cmdline) or o.name, "address": o.address}
            for o in owners
        ]
        who = "; ".join(o.describe() for o in owners) or "a process this user cannot see"
        pids = " ".join(str(o.pid) for o in owners if o.pid is not None)
        stop = (
            f"Stop what holds it (`kill {pids}`: often a leftover run)"
            if pids
            else ("Find what holds it (`ss -ltnp` as root)")
        )
        return failed(
            f"port {port} is already in use by {who} (Address already in use)",
            fix=f"{stop}, or pick a free port: MASTER_PORT={free} (torchrun --master-port {free}); "
            "single-node jobs can use `torchrun --standalone`, which picks a free port itself.",
            details=(
                *note,
                *(
                    f"listen on {_hostport(a.address, port)}: {a.error}"
                    for a in bind.attempts
                    if not a.ok
                ),
            ),
            facts=facts,
        )
    reason = next((a.error for a in bind.attempts if a.error), "unknown error")
    return failed(
        f"cannot listen on port {port}: {reason}",
        fix=f"Use a port this user may bind, above 1023, e.g. MASTER_PORT={free}.",
        details=note,
        facts=facts,
    )


@check("network.master_addr", "Master address", timeout_s=10.0)
def master_addr(ctx: CheckContext) -> CheckOutcome:
    skip = _skip_for_scheme(ctx)
    if skip:
        return skip
    plan, label = ctx.plan, net_facts.addr_label(ctx)
    addr = plan.master_addr
    if not addr:
        if plan.multi_node:
            return failed(
                f"MASTER_ADDR is not set for a job on {plan.nnodes} nodes",
                fix="Set MASTER_ADDR to the IP address of the rank-0 node on every node "
                "(torchrun --master-addr IP, or --rdzv-endpoint IP:PORT).",
            )
        return passed("MASTER_ADDR is not set: torchrun uses 127.0.0.1 for a single-node job")
    reading = numeric_host_reading(addr)
    if reading is not None:
        return failed(
            f"{label}={addr} is an all-digit host name: it is read as an IPv4 number "
            f"({reading}), not looked up as a name",
            fix="Use the master's IP address (dotted) or a host name with a letter in it, "
            "e.g. MASTER_ADDR=$(hostname -I | cut -d' ' -f1) on the master.",
            facts={"master_addr": addr, "read_as": reading},
        )
    resolution = resolve(ctx, addr)
    facts: dict[str, object] = {"master_addr": addr, "addresses": resolution.addresses}
    if resolution.timed_out:
        return failed(
            f"{label}={addr} did not resolve within {net_facts.RESOLVE_TIMEOUT_S:g} s: "
            "the DNS server does not answer",
            fix=f"Use the master's IP address instead of a name, or fix the DNS servers in "
            f"/etc/resolv.conf (try `getent hosts {addr}`).",
            facts=facts,
        )
    if not resolution.ok:
        return failed(
            f"{label}={addr} does not resolve: {resolution.error}",
            fix=f"Use the master's IP address, or a name every node resolves "
            f"(check with `getent hosts {addr}` on each node; fix DNS or /etc/hosts).",
            facts=facts,
        )
    shown = ", ".join(resolution.addresses)
    loopback = [a for a in resolution.addresses if is_loopback(a)]
    if plan.multi_node and loopback:
        return failed(
            f"{label}={addr} is a loopback address ({shown}) but the job spans "
            f"{plan.nnodes} nodes: the other nodes would connect to themselves",
            fix=f"Set {label.removeprefix('the host of ')} to the routable IP address of the "
            "node that hosts the rendezvous (usually rank 0's; e.g. `hostname -I` on that node), the "
            "same on every node.",
            facts=facts,
        )
    if plan.multi_node and all(is_link_local(a) for a in resolution.addresses):
        return warning(
            f"{label}={addr} resolves only to link-local addresses ({shown})",
            fix="Use an address on the nodes' routed network; link-local addresses work only "
            "on one network segment and change with the interface.",
            facts=facts,
        )
    if master_is_here(ctx, resolution):
        return passed(f"{addr} resolves to {shown} (this host is the master)", facts=facts)
    return _connect_to_master(ctx, addr, shown, facts)


def _connect_to_master(ctx: CheckContext, addr: str, shown: str, facts: dict) -> CheckOutcome:
    port_text, port_number = master_port_text(ctx)
    port = port_number if port_number is not None else DEFAULT_MASTER_PORT
    if (port_text is not None and port_number is None) or not 1 <= port <= 65535:
        return passed(f"{addr} resolves to {shown} (no connect test: the port is invalid)")
    budget = net_facts.RESOLVE_TIMEOUT_S + CONNECT_TIMEOUT_S * 2.25  # two addresses, a margin
    outcome = bounded_call(
        lambda: ctx.probes.net.connect(addr, port, CONNECT_TIMEOUT_S), budget, name="connect"
    )
    result = outcome.value if outcome.ok else None
    if result is None:
        why = "no answer" if outcome.timed_out else str(outcome.error)
        result = ConnectResult(addr, port, "timeout" if outcome.timed_out else "error", error=why)
    facts = {**facts, "port": port, "connect": result.outcome}
    target = f"{addr}:{port}"
    if result.ok:
        return passed(f"{target} accepts connections (the master's store is up)", facts=facts)
    if result.outcome == "refused":
        return warning(
            f"nothing listens on {target} yet (connection refused)",
            fix="Normal before the job starts: rank 0 opens the port when it starts. If the job "
            f"is running, check that MASTER_PORT={port} is the master's port and the master is up.",
            details=(f"{addr} resolves to {shown}",),
            facts=facts,
        )
    if result.outcome == "timeout":
        return failed(
            f"connecting to {target} timed out after {CONNECT_TIMEOUT_S:g} s: "
            "a firewall drops the packets or the address is wrong",
            fix=f"Check that {addr} is the master's address and allow TCP port {port} (and the "
            f"ephemeral ports gloo/NCCL use) between the nodes; test with `nc -zv {addr} {port}`.",
            facts=facts,
        )
    return failed(
        f"cannot connect to {target}: {result.error or result.outcome}",
        fix=f"Check the route to {addr} (`ip route get {shown.split(', ')[0]}`) and that this "
        "node is on the master's network.",
        facts=facts,
    )


@check("network.hostname", "Host name", timeout_s=10.0)
def hostname(ctx: CheckContext) -> CheckOutcome:
    name = ctx.probes.net.hostname()
    resolution = resolve(ctx, name)
    gloo_ifname = ctx.env.get("GLOO_SOCKET_IFNAME")
    multi = spans_hosts(ctx)
    nic = _suggested_nic(ctx)
    facts = {"hostname": name, "addresses": resolution.addresses, "multi_node": multi}
    if not resolution.ok:
        summary = f"this host's name {name!r} does not resolve ({resolution.error})"
        fix = f"Add '<this node's IP> {name}' to /etc/hosts, or set GLOO_SOCKET_IFNAME={nic}."
        if multi and not gloo_ifname:
            return failed(
                f"{summary}: gloo falls back to loopback and other nodes cannot reach it",
                fix=fix,
                facts=facts,
            )
        return warning(f"{summary}: gloo falls back to the loopback address", fix=fix, facts=facts)
    shown = ", ".join(resolution.addresses)
    loopback = [a for a in resolution.addresses if is_loopback(a)]
    if not loopback:
        return passed(f"{name} resolves to {shown}", facts=facts)
    if multi and not gloo_ifname:
        return failed(
            f"{name} resolves to {', '.join(loopback)} (loopback): gloo binds and advertises "
            'that address, so ranks on other nodes cannot connect ("Gloo connectFullMesh '
            'failed ... remote=[127.0.0.1]")',
            fix=f"Set GLOO_SOCKET_IFNAME={nic} on every node, or map {name} to the node's "
            f"routable IP in /etc/hosts instead of {loopback[0]}.",
            facts=facts,
        )
    if multi:
        return passed(
            f"{name} resolves to loopback ({shown}), but GLOO_SOCKET_IFNAME={gloo_ifname} "
            "chooses gloo's interface",
            facts=facts,
        )
    return passed(
        f"{name} resolves to {shown} (loopback): fine on one node",
        details=(
            "A job across nodes would need GLOO_SOCKET_IFNAME (gloo binds to what the host "
            "name resolves to).",
        ),
        facts=facts,
    )


@check("network.interfaces", "Network interfaces", timeout_s=5.0)
def interfaces(ctx: CheckContext) -> CheckOutcome:
    found = ctx.probes.net.interfaces()
    listed = [{"name": i.name, "up": i.up, "addresses": list(i.addresses)} for i in found]
    details = tuple(
        f"{i.name}: {'up' if i.up else 'down'} {', '.join(i.addresses) or '(no address)'}"
        for i in found
    )
    facts = {"interfaces": listed}
    loopback_up = [i for i in found if i.up and any(is_loopback(a) for a in i.addresses)]
    routable = routable_interfaces(found)
    if not any(i.up for i in found):
        return failed(
            "no network interface is up, not even loopback: ranks cannot reach each other",
            fix="Bring up the loopback interface (`ip link set lo up`) and the node's network; "
            "a container started with `--network none` has none.",
            details=details,
            facts=facts,
        )
    if ctx.plan.multi_node and not routable:
        return failed(
            "no interface with an address other nodes can reach is up (only loopback or "
            f"link-local), but the job spans {ctx.plan.nnodes} nodes",
            fix="Connect this node to the other nodes' network (a container may need "
            "`--network host`), then set NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME to that NIC.",
            details=details,
            facts=facts,
        )
    if not loopback_up and not ctx.plan.multi_node:
        return failed(
            "the loopback interface is down: local ranks connect through 127.0.0.1",
            fix="Bring it up: `ip link set lo up` (as root).",
            details=details,
            facts=facts,
        )
    names = ", ".join(f"{i.name} ({i.addresses[0]})" for i in routable) or "loopback only"
    return passed(f"up: {names}", details=details, facts=facts)


def _inside_a_launched_job(ctx: CheckContext) -> bool:
    """Started by a launcher (torchrun, srun, mpirun) as one of the job's ranks, whose store
    may already hold MASTER_PORT."""
    return any(k in ctx.env for k in ("TORCHELASTIC_RUN_ID", "RANK", "OMPI_COMM_WORLD_RANK"))


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _suggested_nic(ctx: CheckContext) -> str:
    routable = routable_interfaces(ctx.probes.net.interfaces())
    return routable[0].name if routable else "<nic>"
