"""The multi-host lab (`make lab`, scripts/lab.sh) as the tests use it: whether it is up, and the
command that runs something on one of its hosts (its network, name, pids, /etc/hosts).

The hosts h1..hN are namespaces on this machine; a test enters one with nsenter, exactly as
`scripts/lab.sh exec` does, so the processes it starts are killed with their group as usual.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from tests.procs import REPO

STATE = Path("/run/ddplab")
PREFIX = "ddplab"
LAB_SCRIPT = REPO / "scripts" / "lab.sh"
# The lab's fixed addresses (scripts/lab.sh): eth0 on the shared bridge, eth1 on its own.
ETH0 = "198.18.0.{}"
ETH1 = "198.19.0.{}"


def hosts() -> list[str]:
    try:
        return (STATE / "hosts").read_text().split()
    except OSError:
        return []


def address(host: str, nic: int = 0) -> str:
    return (ETH0 if nic == 0 else ETH1).format(10 + int(host.lstrip("h")))


def _pid(host: str) -> int | None:
    try:
        pid = int((STATE / f"{host}.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def down_reason(need: int = 2) -> str | None:
    """None when the lab is up with at least `need` hosts; else why the lab tests are skipped."""
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces)"
    if not shutil.which("nsenter"):
        return "nsenter (util-linux) is not installed"
    found = hosts()
    if len(found) < need:
        return f"the multi-host lab is not up with {need} hosts (make lab)"
    dead = [h for h in found if _pid(h) is None]
    if dead:
        return f"lab hosts {', '.join(dead)} are down (make lab-stop lab)"
    return None


def on_host(host: str, cmd: Sequence[str], *, hosts_file: Path | None = None) -> list[str]:
    """`cmd` run on `host`, in this directory; with `hosts_file`, it alone sees that /etc/hosts."""
    pid = _pid(host)
    if pid is None:
        raise RuntimeError(f"lab host {host} is not up")
    enter = ["nsenter", "-t", str(pid), "-n", "-u", "-m", "-p", f"--wd={os.getcwd()}", "--"]
    if hosts_file is not None:
        bind = 'mount --bind "$0" /etc/hosts && exec "$@"'
        enter += ["unshare", "--mount", "--", "sh", "-c", bind, str(hosts_file)]
    return [*enter, *cmd]


def iptables(host: str, *rule: str) -> None:
    """One iptables rule on `host` (scripts/lab.sh fw)."""
    subprocess.run(["bash", str(LAB_SCRIPT), "fw", host, *rule], check=True, timeout=30)


def iptables_together(host: str, rules: list[list[str]]) -> None:
    """Append `rules` ([CHAIN, match...]) to `host`'s filter table in one transaction
    (iptables-restore --noflush): a link cut both ways is never cut one way for a moment (two
    iptables calls apart took seconds on a loaded machine, and the watcher saw one way cut)."""
    restore = "iptables-legacy-restore" if shutil.which("iptables-legacy") else "iptables-restore"
    batch = "*filter\n" + "".join(f"-A {' '.join(rule)}\n" for rule in rules) + "COMMIT\n"
    subprocess.run(
        ["ip", "netns", "exec", f"{PREFIX}-{host}", restore, "--noflush", "-w"],
        input=batch, text=True, check=True, timeout=30, capture_output=True,
    )  # fmt: skip


def clear_firewall(host: str) -> None:
    subprocess.run(["bash", str(LAB_SCRIPT), "fw-clear", host], check=True, timeout=30)


def set_mtu(host: str, mtu: int, dev: str = "eth0") -> None:
    """`dev`'s MTU on `host`; the bridge side stays at 1500 (scripts/lab.sh mtu)."""
    subprocess.run(["bash", str(LAB_SCRIPT), "mtu", host, dev, str(mtu)], check=True, timeout=30)


SLURM_CONF = STATE / "slurm" / "slurm.conf"


def slurm_down_reason() -> str | None:
    """None when the lab's own Slurm (make lab-cluster) has every lab host idle; else why not."""
    reason = down_reason()
    if reason is not None:
        return reason
    if not SLURM_CONF.exists():
        return "the lab's Slurm is not up (make lab-cluster)"
    env = {**os.environ, "SLURM_CONF": str(SLURM_CONF)}
    try:
        out = subprocess.run(
            on_host("h1", ["sinfo", "-h", "-N", "-o", "%T"]),
            capture_output=True, text=True, timeout=20, env=env,
        ).stdout.split()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the lab's Slurm does not answer: {exc}"
    if len([s for s in out if s in ("idle", "mixed", "allocated")]) < len(hosts()):
        return (
            f"the lab's Slurm nodes are not all up ({', '.join(out) or 'none'}; make lab-cluster)"
        )
    return None
