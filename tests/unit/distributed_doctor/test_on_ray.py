"""`doctor --distributed --ray`: which node is rank 0, what each node's doctor is given."""

from __future__ import annotations

from ddpdoctor.cli import parse_args
from ddpdoctor.distributed_doctor.on_ray import cluster_nodes, doctor_argv, forwarded_env, node_env
from ddpdoctor.launchers.identity import detect_launch


def _node(node_id: str, addr: str, *, alive: bool = True, head: bool = False, gpus: float = 0):
    resources = {"CPU": 2.0, f"node:{addr}": 1.0, **({"GPU": gpus} if gpus else {})}
    if head:
        resources["node:__internal_head__"] = 1.0
    return {
        "NodeID": node_id,
        "Alive": alive,
        "NodeManagerAddress": addr,
        "NodeManagerHostname": f"host-{node_id}",
        "Resources": resources,
    }


def test_the_drivers_node_is_rank_0_then_the_others_by_address() -> None:
    listing = [
        _node("c", "10.0.0.10"),
        _node("a", "10.0.0.9", head=True),
        _node("d", "10.0.0.2", alive=False),
        _node("b", "10.0.0.3", gpus=8),
    ]
    assert [n.node_id for n in cluster_nodes(listing, "c")] == ["c", "b", "a"]
    # a driver outside the cluster (Ray Client): the head leads
    assert [n.node_id for n in cluster_nodes(listing, "zz")] == ["a", "b", "c"]
    assert cluster_nodes(listing, "c")[1].gpus == 8


def test_each_node_is_a_rank_with_node_0_as_master() -> None:
    nodes = cluster_nodes([_node("a", "10.0.0.1", head=True), _node("b", "10.0.0.2")], "a")
    env = node_env(1, nodes, 40123)
    assert env["RANK"] == env["NODE_RANK"] == "1"
    assert (env["WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("2", "10.0.0.1", "40123")
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.node_rank, info.world_size) == ("ray", 1, 1, 2)


def test_flags_reach_every_node_and_files_only_rank_0() -> None:
    args = parse_args(
        ["doctor", "--distributed", "--ray", "--timeout", "9", "--json", "--junit-xml", "r.xml",
         "--nproc", "4", "cluster"]
    )  # fmt: skip
    assert args.ray == ""
    rank0 = doctor_argv(args, rank0=True)
    other = doctor_argv(args, rank0=False)
    assert rank0[:5] == ["doctor", "--distributed", "--timeout", "9.0", "--backend"]
    assert "--json" in other and other[-1] == "cluster"
    assert other[other.index("--nproc") + 1] == "4"
    assert "--junit-xml" in rank0 and "--junit-xml" not in other
    assert parse_args(["doctor", "--distributed", "--ray", "10.0.0.1:6379"]).ray == "10.0.0.1:6379"


def test_only_nccl_and_gloo_variables_travel_to_the_nodes() -> None:
    env = {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "PATH": "/bin", "RANK": "3"}
    assert forwarded_env(env) == {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}


def test_the_thread_that_started_a_local_cluster_lives_until_the_doctor_is_done() -> None:
    """A local cluster's GCS and raylet get SIGKILL (their parent-death signal) when the thread
    that forked them ends: ray.init()'s thread waits for `done`, and the caller does not."""
    import threading
    import time

    from ddpdoctor.distributed_doctor.on_ray import _connect

    started: list[threading.Thread] = []

    class FakeRay:
        def init(self, **_: object) -> None:
            started.append(threading.current_thread())

    done = threading.Event()
    begun = time.monotonic()
    _connect(FakeRay(), "local", 30.0, done)
    assert time.monotonic() - begun < 5  # answered: no wait for the deadline
    assert started and started[0].is_alive()
    done.set()
    started[0].join(5)
    assert not started[0].is_alive()
