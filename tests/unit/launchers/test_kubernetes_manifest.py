"""The init-container manifest of docs/kubernetes.md, checked against ddpdoctor's real command
line and its reading of the PET_* variables (no cluster: the manifest is parsed, not applied)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ddpdoctor.checks.plan import build_plan
from ddpdoctor.cli import build_parser
from ddpdoctor.launchers.identity import detect_launch
from ddpdoctor.launchers.kubernetes import PET_VARS

DOC = Path(__file__).resolve().parents[3] / "docs" / "kubernetes.md"
INDEX_ANNOTATION = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def manifest() -> dict[str, dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1, "one manifest in docs/kubernetes.md"
    return {doc["kind"]: doc for doc in yaml.safe_load_all(blocks[0])}


def pod_env(container: dict, index: int) -> dict[str, str]:
    """The container's environment as the kubelet gives it to pod `index`."""
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == INDEX_ANNOTATION
            env[item["name"]] = str(index)
    return {**env, "KUBERNETES_SERVICE_HOST": "10.96.0.1"}


def test_the_init_container_runs_the_distributed_doctor_with_json_and_a_timeout():
    pod = manifest()["Job"]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    command = init["command"]
    assert command[0] == "ddpdoctor"
    args = build_parser().parse_args(command[1:])
    assert (args.command, args.distributed, args.json, args.timeout) == (
        "doctor",
        True,
        True,
        120.0,
    )


def test_its_environment_is_the_launch_the_doctor_reads_for_each_pod():
    spec = manifest()["Job"]["spec"]
    pod = spec["template"]["spec"]
    (init,) = pod["initContainers"]
    assert {item["name"] for item in init["env"]} <= set(PET_VARS)
    for index in range(spec["completions"]):
        info = detect_launch(pod_env(init, index))
        assert (info.launcher, info.rank, info.world_size) == ("pet", index, spec["completions"])
        assert (info.master_addr, info.master_port) == ("ddp-0.ddp", 29500)
        plan = build_plan(pod_env(init, index))
        assert plan.nproc_per_node == 8 and plan.is_master_host() == (index == 0)


def test_the_master_name_is_pod_0_of_the_headless_service_published_before_ready():
    docs = manifest()
    service, pod = docs["Service"], docs["Job"]["spec"]["template"]["spec"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    assert pod["subdomain"] == service["metadata"]["name"]
    job = docs["Job"]["metadata"]["name"]
    (init,) = pod["initContainers"]
    master = pod_env(init, 1)["PET_MASTER_ADDR"]
    assert master == f"{job}-0.{service['metadata']['name']}"
    ports = {p["port"] for p in service["spec"]["ports"]}
    assert int(pod_env(init, 1)["PET_MASTER_PORT"]) in ports


def test_the_training_container_gets_the_same_pet_variables_and_dev_shm():
    pod = manifest()["Job"]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (train,) = pod["containers"]
    assert train["env"] == init["env"]
    assert train["command"][0] == "torchrun" and "--nnodes" not in train["command"]
    volume = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert volume["emptyDir"]["medium"] == "Memory"
    for container in (init, train):
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
