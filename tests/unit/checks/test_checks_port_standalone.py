"""A busy port 29500 blocks no launch that never uses it (issue 15): `ddpdoctor run` on one node
uses torchrun --standalone, which picks a free port itself, and says so to the port check."""

from __future__ import annotations

import socket

from ddpdoctor.checks import network
from ddpdoctor.checks.context import CheckContext, DoctorOptions
from ddpdoctor.checks.model import Status


def test_a_port_in_use_fails_unless_the_launch_picks_its_own():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {"MASTER_PORT": str(port), "MASTER_ADDR": "127.0.0.1"}
        plain = network.master_port(CheckContext(env=env, options=DoctorOptions(smoke=False)))
        assert plain.status is Status.FAIL and "already in use" in plain.summary
        standalone = network.master_port(
            CheckContext(env=env, options=DoctorOptions(smoke=False, launcher_picks_port=True))
        )
    assert standalone.status is Status.PASS
    assert "picks a free port itself (torchrun --standalone)" in standalone.summary
    assert standalone.facts["source"] == "standalone"
