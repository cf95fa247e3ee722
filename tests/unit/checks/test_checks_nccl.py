"""nccl.* checks, NCCL's interface-matching rules and the variable table."""

from __future__ import annotations

import dataclasses

import pytest

from ddpdoctor.checks.context import DoctorOptions
from ddpdoctor.checks.model import CheckResult, Status
from ddpdoctor.checks.nccl import (
    nccl_available,
    nccl_debug_file,
    nccl_env,
    nccl_flight_recorder,
    nccl_ifname,
    nccl_transport,
)
from ddpdoctor.checks.nccl_ifname import (
    gloo_problems,
    is_link_local_only,
    nccl_candidates,
    parse_ifname_list,
)
from ddpdoctor.checks.nccl_settings import parse_conf
from ddpdoctor.checks.nccl_vars import KNOWN, nearest_names, value_problem
from ddpdoctor.checks.probes.fs import DirStatus
from ddpdoctor.checks.probes.net import NetInterface
from ddpdoctor.checks.runner import run_checks
from tests.unit.recorded_machines import context, load_machine, writable


def run(check, ctx) -> CheckResult:
    result = check(ctx)
    assert result.status is not Status.ERROR, (result.summary, result.details)
    if result.status in (Status.WARN, Status.FAIL):
        assert result.fix, "every warning and failure carries a fix"
    return result


def options(**kw) -> DoctorOptions:
    return DoctorOptions(smoke=False, **kw)


TWO_NODES = options(nnodes=2)

# --- nccl.available ----------------------------------------------------------------------------


def test_nccl_version_and_package():
    result = run(nccl_available, context("a100-8x"))
    assert result.status is Status.PASS
    assert result.summary == "NCCL 2.20.5 (nvidia-nccl-cu12 2.20.5)"
    assert result.facts["torch_reports"] == "2.20.5"


def test_cpu_build_with_auto_uses_gloo_and_with_nccl_fails():
    auto = run(nccl_available, context("cpu-only"))
    assert auto.status is Status.PASS and "DDP will use gloo" in auto.summary
    nccl = run(nccl_available, context("cpu-only", options=options(backend="nccl")))
    assert nccl.status is Status.FAIL
    assert "Distributed package doesn't have NCCL built in" in nccl.summary
    assert "backend gloo" in nccl.fix


def test_nccl_on_windows_fails_when_asked_for():
    torch = dataclasses.replace(load_machine("a100-8x").torch, platform="win32")
    result = run(nccl_available, context("a100-8x", torch=torch, options=options(backend="nccl")))
    assert result.status is Status.FAIL and "only on Linux" in result.summary


def test_statically_linked_nccl_takes_torchs_word():
    result = run(nccl_available, context("exclusive-process"))
    assert result.status is Status.PASS
    assert result.summary == "NCCL 2.14.3"


def test_cuda_build_without_gpu_says_gloo():
    result = run(nccl_available, context("cpu-only", torch=load_machine("a100-8x").torch))
    assert result.summary.endswith("no GPU visible, so DDP will use gloo")


def test_nccl_wheel_mismatch_warns():
    torch = dataclasses.replace(load_machine("a100-8x").torch, nccl_package_version="2.21.5")
    result = run(nccl_available, context("a100-8x", torch=torch))
    assert result.status is Status.WARN
    assert "torch loads NCCL 2.20.5" in result.summary and "2.21.5" in result.summary
    assert "F25" in result.summary
    assert "pip install 'nvidia-nccl-cu12==2.20.5'" in result.fix


def test_a_different_libnccl_loaded_at_run_time_warns():
    runtime = dataclasses.replace(load_machine("a100-8x").runtime, nccl_version="2.19.3")
    result = run(nccl_available, context("a100-8x", runtime=runtime))
    assert result.status is Status.WARN and "torch reports NCCL 2.19.3" in result.summary


# --- nccl.env ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "status", "words"),
    [
        ({}, Status.PASS, ["no NCCL_* variables set"]),
        ({"NCCL_DEBUG": "INFO", "NCCL_P2P_LEVEL": "NVL"}, Status.PASS, ["2 NCCL setting(s)"]),
        ({"NCCL_DEUBG": "INFO"}, Status.WARN, ["NCCL_DEUBG", "did you mean NCCL_DEBUG?"]),
        ({"NCCL_SOCKET_IFNAM": "eth0"}, Status.WARN, ["did you mean NCCL_SOCKET_IFNAME?"]),
        ({"NCCL_FOO": "1"}, Status.WARN, ["NCCL_FOO", "no effect"]),
        ({"NCCL_DEBUG": "verbose"}, Status.WARN, ["NCCL_DEBUG='verbose'", "VERSION, WARN"]),
        ({"NCCL_DEBUG": "info"}, Status.PASS, []),  # NCCL compares case-insensitively
        ({"NCCL_P2P_LEVEL": "PCI"}, Status.WARN, ["NCCL_P2P_LEVEL='PCI' is not a level"]),
        ({"NCCL_P2P_LEVEL": "3"}, Status.PASS, []),
        ({"NCCL_IB_GID_INDEX": "abc"}, Status.WARN, ["NCCL_IB_GID_INDEX='abc' is not an integer"]),
        ({"NCCL_IB_GID_INDEX": "-1"}, Status.PASS, []),
        ({"NCCL_P2P_DISABLE": "yes"}, Status.WARN, ["is not 0 or 1"]),
        ({"NCCL_SOCKET_NTHREADS": "32"}, Status.WARN, ["above the maximum 16"]),
        ({"NCCL_IB_TIMEOUT": "40"}, Status.WARN, ["above the maximum 31"]),
        ({"NCCL_ALGO": "ring,tree2"}, Status.WARN, ["unknown entries tree2"]),
        ({"NCCL_ALGO": "allreduce:^ring;broadcast:tree"}, Status.PASS, []),
        ({"NCCL_DEBUG_SUBSYS": "^INIT,NET"}, Status.PASS, []),
        ({"NCCL_WORK_FIFO_BYTES": "1000"}, Status.WARN, ["not a power of 2"]),
        ({"TORCH_NCCL_BLOKING_WAIT": "1"}, Status.WARN, ["did you mean TORCH_NCCL_BLOCKING_WAIT?"]),
        ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "7"}, Status.WARN, ["not one of 0, 1, 2, 3"]),
        ({"NCCL_TRACE_BUFFER_SIZE": "2000"}, Status.WARN, ["TORCH_NCCL_TRACE_BUFFER_SIZE"]),
    ],
)
def test_nccl_variables(env, status, words):
    result = run(nccl_env, context(env=env))
    assert result.status is status, result.summary
    for word in words:
        assert word in result.summary


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
        ("NCCL_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT"),
        ("NCCL_DESYNC_DEBUG", "TORCH_NCCL_DESYNC_DEBUG"),
        ("NCCL_IB_CUDA_SUPPORT", "NCCL_NET_GDR_LEVEL"),
        ("NCCL_MAX_NRINGS", "NCCL_MAX_NCHANNELS"),
    ],
)
def test_renamed_variables_name_their_replacement(old, new):
    result = run(nccl_env, context(env={old: "1"}))
    assert result.status is Status.WARN
    assert f"use {new}" in result.summary
    assert result.fix == f"export {new}=1 and unset {old}"


def test_typo_fix_keeps_the_value():
    result = run(nccl_env, context(env={"NCCL_DEUBG": "INFO"}))
    assert result.fix == "rename NCCL_DEUBG to NCCL_DEBUG (export NCCL_DEBUG=INFO)"


# What NVIDIA's CUDA / PyTorch container images export in every shell (nvidia/cuda Dockerfiles).
CONTAINER_ENV = {
    "NCCL_VERSION": "2.21.5-1",
    "NV_LIBNCCL_VERSION": "2.21.5-1",
    "NV_LIBNCCL_PACKAGE": "libnccl2=2.21.5-1+cuda12.4",
    "NV_LIBNCCL_PACKAGE_NAME": "libnccl2",
    "NV_LIBNCCL_PACKAGE_VERSION": "2.21.5-1",
    "NV_LIBNCCL_DEV_PACKAGE": "libnccl-dev=2.21.5-1+cuda12.4",
    "NV_LIBNCCL_DEV_PACKAGE_NAME": "libnccl-dev",
    "NV_LIBNCCL_DEV_PACKAGE_VERSION": "2.21.5-1",
}


def test_container_image_variables_pass_doctor_strict():
    report = run_checks(["nccl.env"], context=context(env=CONTAINER_ENV), strict=True)
    result = report.by_id("nccl.env")
    assert result.status is Status.PASS, result.summary
    assert report.exit_code == 0
    assert "did you mean" not in " ".join(result.details)
    assert "NCCL_VERSION=2.21.5-1: set by the container image; NCCL does not read it" in (
        result.details
    )
    assert not any(d.startswith("NV_LIBNCCL") for d in result.details)  # not NCCL_*: not linted


def test_container_image_variables_do_not_hide_a_typo():
    env = {**CONTAINER_ENV, "NCCL_SOKET_IFNAME": "eth0"}
    report = run_checks(["nccl.env"], context=context(env=env), strict=True)
    result = report.by_id("nccl.env")
    assert result.status is Status.WARN
    assert result.summary == (
        "NCCL_SOKET_IFNAME is not a variable NCCL or torch reads: did you mean NCCL_SOCKET_IFNAME?"
    )
    assert report.exit_code != 0


def test_configuration_files_are_read_with_nccl_precedence():
    files = {
        "/etc/nccl.conf": "# site defaults\nNCCL_DEBUG=WARN\nNCCL_DEUBG=INFO\nNCCL_IB_DISABLE=1\n",
        "/home/u/.nccl.conf": "NCCL_IB_DISABLE=0\n",
    }
    ctx = context(env={"HOME": "/home/u", "NCCL_DEBUG": "INFO"}, files=files)
    result = run(nccl_env, ctx)
    assert result.status is Status.WARN
    assert "NCCL_DEUBG (from /etc/nccl.conf)" in result.summary
    settings = result.facts["settings"]
    assert settings["NCCL_DEBUG"] == "INFO"  # the environment wins over files
    assert settings["NCCL_IB_DISABLE"] == "0"  # the user's file wins over /etc
    assert result.facts["sources"]["NCCL_IB_DISABLE"] == "/home/u/.nccl.conf"


def test_nccl_conf_file_replaces_the_home_file():
    files = {"/cfg/nccl.conf": "NCCL_P2P_LEVEL=PCI\n", "/home/u/.nccl.conf": "NCCL_X=1\n"}
    ctx = context(env={"HOME": "/home/u", "NCCL_CONF_FILE": "/cfg/nccl.conf"}, files=files)
    result = run(nccl_env, ctx)
    assert "NCCL_P2P_LEVEL='PCI' is not a level" in result.summary
    assert "NCCL_X" not in result.facts["settings"]


def test_conf_parsing():
    text = "A=1\n  B = two words # note\n# C=3\nnot a setting\n=x\n"
    assert parse_conf(text) == [("A", "1"), ("B", "two words")]


@pytest.mark.parametrize(
    ("typo", "expected"),
    [
        ("NCCL_DEUBG", "NCCL_DEBUG"),
        ("NCCL_DBG", "NCCL_DEBUG"),
        ("NCCL_SOCKETIFNAME", "NCCL_SOCKET_IFNAME"),
        ("NCCL_IFNAME", "NCCL_SOCKET_IFNAME"),
        ("NCCL_IB_DISABEL", "NCCL_IB_DISABLE"),
        ("NCCL_P2P_DISABLED", "NCCL_P2P_DISABLE"),
        ("NCCL_IB_GID", "NCCL_IB_GID_INDEX"),
        ("NCCL_DEBUG_SUBSYSTEM", "NCCL_DEBUG_SUBSYS"),
        ("NCCL_NSOCKS_PER_THREAD", "NCCL_NSOCKS_PERTHREAD"),
        ("TORCH_NCCL_BLOKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT"),
    ],
)
def test_nearest_name(typo, expected):
    assert nearest_names(typo)[0] == expected


def test_no_suggestion_for_unrelated_names():
    assert nearest_names("NCCL_FOO") == []
    assert nearest_names("NCCL_WHATEVER_THIS_IS") == []


def test_the_table_knows_the_common_variables():
    for name in (
        "NCCL_DEBUG", "NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS", "NCCL_SOCKET_IFNAME",
        "NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_P2P_LEVEL",
        "NCCL_NET_GDR_LEVEL", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_ALGO", "NCCL_PROTO",
        "NCCL_BUFFSIZE", "NCCL_NSOCKS_PERTHREAD", "NCCL_SOCKET_NTHREADS", "NCCL_CROSS_NIC",
        "NCCL_NET", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "TORCH_NCCL_BLOCKING_WAIT",
    ):  # fmt: skip
        assert name in KNOWN, name
    assert value_problem("NCCL_NET_GDR_LEVEL", "PHB") is None


# --- interface rules (NCCL's socket.cc) --------------------------------------------------------


def iface(name, up=True, v4=(), v6=()):
    return NetInterface(name, up, tuple(v4), tuple(v6))


HOST = [
    iface("lo", v4=["127.0.0.1"], v6=["::1"]),
    iface("eth0", v4=["10.0.0.5"]),
    iface("eth1", v4=["10.1.0.5"]),
    iface("docker0", v4=["172.17.0.1"]),
    iface("ib0", v4=["192.168.9.5"]),
    iface("enp1s0", v6=["fd00::5"]),
]


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("eth", ["eth0", "eth1"]),  # prefix match by default
        ("eth0", ["eth0"]),
        ("=eth", []),  # = asks for exact names
        ("=eth0,eth1", ["eth0", "eth1"]),
        ("^docker,lo", ["eth0", "eth1", "ib0", "enp1s0"]),
        ("^=docker0", ["lo", "eth0", "eth1", "ib0", "enp1s0"]),
        ("^eth,ib,docker", ["lo", "enp1s0"]),
        ("eth1:0", ["eth1"]),  # name:port as in NCCL's list parser
        ("doesnotexist0", []),
        ("e", ["ib0"]),  # one character: ignored, NCCL falls back to its default (ib first)
    ],
)
def test_nccl_socket_ifname_rules(value, names):
    chosen, _ = nccl_candidates(value, HOST)
    assert [i.name for i in chosen] == names


def test_nccl_default_order():
    chosen, rule = nccl_candidates(None, HOST)
    assert [i.name for i in chosen] == ["ib0"] and rule == "default: ib"
    no_ib = [i for i in HOST if i.name != "ib0"]
    chosen, rule = nccl_candidates(None, no_ib)
    assert [i.name for i in chosen] == ["eth0", "eth1", "enp1s0"] and rule == "default: ^docker,lo"
    chosen, rule = nccl_candidates(None, [HOST[0], HOST[3]])
    assert [i.name for i in chosen] == ["docker0"]
    chosen, rule = nccl_candidates(None, [HOST[0]])
    assert [i.name for i in chosen] == ["lo"]
    assert nccl_candidates(None, [iface("lo", v6=["::1"])])[0] == []  # IPv6 loopback never


def test_socket_family_restricts_addresses():
    chosen, _ = nccl_candidates("^lo,docker", HOST, "AF_INET6")
    assert [i.name for i in chosen] == ["enp1s0"]


def test_misplaced_markers_and_link_local():
    spec = parse_ifname_list("eth0,^docker")
    assert spec.misplaced == ("^docker",) and not spec.exclude
    assert is_link_local_only(iface("veth1", v6=["fe80::1%veth1"]))
    assert is_link_local_only(iface("eth9", v4=["169.254.20.10"]))
    assert not is_link_local_only(iface("eth0", v4=["10.0.0.1"], v6=["fe80::1%eth0"]))


def test_gloo_rules():
    assert gloo_problems("eth0,eth1", HOST) == []
    problems = gloo_problems("^lo,docker,veth,eni", HOST)
    assert "Unable to find address for: ^lo" in problems[0]  # fixture 41
    assert any("'veth': no such interface" in p for p in problems)
    assert "is an address" in gloo_problems("10.0.0.5", HOST)[0]
    assert "is an address" in gloo_problems("10.0.0.0/24", HOST)[0]
    assert "is down" in gloo_problems("eth2", [iface("eth2", up=False, v4=["1.2.3.4"])])[0]


# --- nccl.ifname -------------------------------------------------------------------------------


def test_a100_uses_infiniband_by_default():
    result = run(nccl_ifname, context("a100-8x"))
    assert result.status is Status.PASS
    assert result.summary == "NCCL would use ib0 (default: ib)"
    assert result.facts["nccl_would_use"] == ["ib0"]


def test_missing_interface_fails_on_a_gpu_node_and_warns_on_cpu():
    env = {"NCCL_SOCKET_IFNAME": "doesnotexist0"}
    gpu = run(nccl_ifname, context("a100-8x", env))
    assert gpu.status is Status.FAIL
    assert "Bootstrap : no socket interface found" in gpu.summary
    assert gpu.fix == "export NCCL_SOCKET_IFNAME=enp226s0"
    cpu = run(nccl_ifname, context("cpu-only", env))
    assert cpu.status is Status.WARN


def test_exact_name_that_exists_passes():
    result = run(nccl_ifname, context("a100-8x", {"NCCL_SOCKET_IFNAME": "=enp226s0"}))
    assert result.status is Status.PASS and "enp226s0" in result.summary


def test_loopback_across_nodes_fails():
    result = run(nccl_ifname, context("a100-8x", {"NCCL_SOCKET_IFNAME": "lo"}, options=TWO_NODES))
    assert result.status is Status.FAIL
    assert "lo (loopback)" in result.summary and "2 nodes" in result.summary


def test_unset_ifname_with_veth_candidates_warns_for_multi_node():
    result = run(nccl_ifname, context("workstation-2gpu-busy", options=TWO_NODES))
    assert result.status is Status.WARN
    assert "veth3f2a1b9" in result.summary and "F15" in result.summary
    assert result.fix == "export NCCL_SOCKET_IFNAME=enp5s0 GLOO_SOCKET_IFNAME=enp5s0"
    single = run(nccl_ifname, context("workstation-2gpu-busy"))
    assert single.status is Status.PASS


def test_gloo_exclusion_syntax_fails():
    env = {"GLOO_SOCKET_IFNAME": "^lo,docker"}
    result = run(nccl_ifname, context("cpu-only", env))
    assert result.status is Status.FAIL
    assert "Unable to find address for: ^lo" in result.summary and "F16" in result.summary
    assert result.fix == "export GLOO_SOCKET_IFNAME=eth0"


def test_gloo_good_name_passes():
    result = run(nccl_ifname, context("cpu-only", {"GLOO_SOCKET_IFNAME": "eth0"}))
    assert result.status is Status.PASS and result.summary.endswith("gloo uses eth0")


def test_nccl_ifname_from_the_configuration_file():
    files = {"/etc/nccl.conf": "NCCL_SOCKET_IFNAME=eth7\n"}
    result = run(nccl_ifname, context("a100-8x", files=files))
    assert result.status is Status.FAIL and "eth7" in result.summary


def test_one_character_value_is_ignored():
    result = run(nccl_ifname, context("a100-8x", {"NCCL_SOCKET_IFNAME": "e"}))
    assert result.status is Status.WARN and "is ignored" in result.summary


# --- nccl.debug_file ---------------------------------------------------------------------------


def test_debug_file_unset_skips():
    assert run(nccl_debug_file, context()).status is Status.SKIP


def test_debug_file_in_a_writable_directory():
    env = {"NCCL_DEBUG_FILE": "/runs/nccl/%h.%p.log", "NCCL_DEBUG": "INFO"}
    result = run(nccl_debug_file, context(env=env, dirs={"/runs/nccl": writable("/runs/nccl")}))
    assert result.status is Status.PASS
    assert result.summary == "/runs/nccl/%h.%p.log: /runs/nccl is writable"


def test_debug_file_in_a_missing_directory():
    env = {"NCCL_DEBUG_FILE": "/nonexistent/nccl.%p.log", "NCCL_DEBUG": "INFO"}
    result = run(nccl_debug_file, context(env=env))
    assert result.status is Status.WARN
    assert "/nonexistent does not exist" in result.summary
    assert result.fix == "mkdir -p /nonexistent"


def test_debug_file_in_a_read_only_directory():
    ro = DirStatus("/ro", exists=True, is_dir=True, writable=False, error="Read-only file system")
    env = {"NCCL_DEBUG_FILE": "/ro/%h.%p.log", "NCCL_DEBUG": "WARN"}
    result = run(nccl_debug_file, context(env=env, dirs={"/ro": ro}))
    assert result.status is Status.WARN and "Read-only file system" in result.summary


def test_debug_file_without_level_or_pid():
    env = {"NCCL_DEBUG_FILE": "/logs/nccl.log"}
    ctx = context(env=env, dirs={"/logs": writable("/logs")}, options=options(nproc=4))
    result = run(nccl_debug_file, ctx)
    assert result.status is Status.WARN
    text = result.summary + " ".join(result.details)
    assert "NCCL_DEBUG is not" in text and "overwrite one file" in text
    assert "export NCCL_DEBUG_FILE=/logs/%h.%p.log" in result.fix


# --- nccl.transport ----------------------------------------------------------------------------


def test_transport_defaults_on_a100():
    result = run(nccl_transport, context("a100-8x"))
    assert result.status is Status.PASS
    assert result.summary == "enabled: P2P, SHM, IB (4 active HCAs); no switches set"
    assert result.facts["infiniband"][0] == {"name": "mlx5_0", "ports": ["1:ACTIVE:InfiniBand"]}


def test_transport_is_skipped_without_gpus_but_keeps_facts():
    result = run(nccl_transport, context("cpu-only", {"NCCL_P2P_DISABLE": "1"}))
    assert result.status is Status.SKIP
    assert result.facts["switches"]["NCCL_P2P_DISABLE"] == "1"


def test_p2p_disabled_warns_with_the_usual_reason():
    result = run(nccl_transport, context("a100-8x", {"NCCL_P2P_DISABLE": "1"}))
    assert result.status is Status.WARN
    assert "F22" in result.summary and "peer access is not supported" in result.summary
    assert "NCCL_P2P_LEVEL" in result.fix


def test_switches_from_the_configuration_file_count():
    files = {"/etc/nccl.conf": "NCCL_SHM_DISABLE=1\n"}
    result = run(nccl_transport, context("a100-8x", files=files))
    assert result.status is Status.WARN and "/dev/shm" in result.summary


def test_ib_disabled_across_nodes_warns():
    env = {"NCCL_IB_DISABLE": "1"}
    result = run(nccl_transport, context("a100-8x", env, options=TWO_NODES))
    assert result.status is Status.WARN and "TCP sockets" in result.summary
    single = run(nccl_transport, context("a100-8x", env))
    assert single.status is Status.PASS  # one node: IB carries nothing anyway


def test_gdr_off_and_wrong_hca():
    env = {"NCCL_NET_GDR_LEVEL": "LOC", "NCCL_IB_HCA": "mlx4"}
    result = run(nccl_transport, context("a100-8x", env, options=TWO_NODES))
    assert result.status is Status.WARN
    text = " ".join(result.details)
    assert "GPUDirect RDMA off" in text and "NCCL_IB_HCA=mlx4 matches none" in text


# --- nccl.flight_recorder ----------------------------------------------------------------------


def with_torch(version: str):
    m = load_machine("cpu-only")
    return context(m, torch=dataclasses.replace(m.torch, version=version))


def test_flight_recorder_usable_on_a_recent_torch():
    result = run(nccl_flight_recorder, with_torch("2.14.1+cu130"))
    assert result.status is Status.PASS
    assert result.summary.startswith("usable (torch 2.14.1+cu130, gloo+nccl)")
    assert result.facts["mode"] == "flight_recorder"


def test_flight_recorder_missing_on_an_old_torch_falls_back_to_the_hook():
    result = run(nccl_flight_recorder, context("cpu-only"))  # torch 2.3.0+cpu
    assert result.status is Status.PASS and result.facts["mode"] == "python_hook"
    assert "not available in torch 2.3.0+cpu" in result.summary
    assert "Python hook fallback" in result.summary


def test_flight_recorder_turned_off_is_a_warning_with_the_fix():
    m = load_machine("cpu-only")
    ctx = context(
        m,
        {"TORCH_FR_BUFFER_SIZE": "0"},
        torch=dataclasses.replace(m.torch, version="2.14.1"),
    )
    result = run(nccl_flight_recorder, ctx)
    assert result.status is Status.WARN and "unset TORCH_FR_BUFFER_SIZE" in result.fix


def test_flight_recorder_hook_forced_by_the_variable():
    m = load_machine("cpu-only")
    ctx = context(
        m, {"DDPDOCTOR_DDP_BUCKETS": "1"}, torch=dataclasses.replace(m.torch, version="2.14.1")
    )
    result = run(nccl_flight_recorder, ctx)
    assert result.status is Status.PASS and result.facts["mode"] == "python_hook"
