"""CBD configuration checks over synthetic facts (Aegis §6 stage 1; Alg. 1 ConfigCheck)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from producers.cbd.checks_config import (
    GpuCountCheck,
    GpuModesCheck,
    NcclEnvCheck,
    NicLinkCheck,
    PcieLinkCheck,
    RoutesCheck,
    VersionsCheck,
)
from producers.cbd.config import CbdConfig
from producers.cbd.model import CheckContext
from producers.cbd.nccl_env import matches, parse_list


def gpu(i: int, **over: Any) -> dict[str, Any]:
    g = {"index": i, "name": "NVIDIA H100", "bus": f"0000:{0x18 + i:02x}:00.0",
         "persistence": 1, "ecc_current": 1, "ecc_pending": 1, "sm_clock_mhz": 345,
         "sm_max_mhz": 1980, "sm_app_mhz": 1755, "clock_reasons": 1, "temp_c": 35,
         "ecc_uncorrected_volatile": 0, "retired_pending": 0,
         "remap": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
         "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16,
         "nvlinks": {"active": 18, "inactive": 0}}
    g.update(over)
    return g


def make_facts(i: int, gpus: int = 8, nvml: bool = True, env: dict[str, str] | None = None,
               mtu: int = 1500) -> dict[str, Any]:
    """Facts of a healthy 8-GPU, 8-NIC host with data address 10.200.0.i."""
    pci = [{"bus": f"0000:{0x18 + g:02x}:00.0", "kind": "gpu", "vendor": "0x10de",
            "class": "0x030200", "cur_width": 16, "max_width": 16, "cur_speed": 32.0,
            "max_speed": 32.0, "netdevs": [], "ibdevs": []} for g in range(gpus)]
    pci += [{"bus": f"0000:{0x40 + g:02x}:00.0", "kind": "nic", "vendor": "0x15b3",
             "class": "0x020000", "cur_width": 16, "max_width": 16, "cur_speed": 32.0,
             "max_speed": 32.0, "netdevs": [f"enp{g}"], "ibdevs": [f"mlx5_{g}"]}
            for g in range(gpus)]
    return {
        "hostname": f"h{i}",
        "net": [{"name": "lo", "operstate": "unknown", "carrier": 1, "mtu": 65536,
                 "speed_mbps": None, "virtual": True, "pci": None},
                {"name": "eth0", "operstate": "up", "carrier": 1, "mtu": mtu,
                 "speed_mbps": 100000, "virtual": False, "pci": "0000:05:00.0"}],
        "ib": [{"dev": f"mlx5_{g}", "port": "1", "state": "4: ACTIVE",
                "phys_state": "5: LinkUp", "rate_gbps": 400.0, "link_layer": "Ethernet",
                "netdev": f"enp{g}", "pci": None} for g in range(gpus)],
        "pci": pci,
        "routes": [{"dst": "default", "dev": "eth0", "gw": "10.200.0.254"},
                   {"dst": "10.200.0.0/24", "dev": "eth0", "gw": None}],
        "addrs": {"lo": ["127.0.0.1/8"], "eth0": [f"10.200.0.{i}/24"]},
        "env": dict(env if env is not None else {"NCCL_IB_HCA": "mlx5",
                                                 "NCCL_SOCKET_IFNAME": "eth0"}),
        "nccl": {"version": "2.21.5", "source": "env NCCL_VERSION"},
        "tools": {"all_reduce_perf": None, "mpirun": None},
        "torch": False,
        "nvml": ({"available": True, "driver": "550.54.15", "cuda": "12.4", "count": gpus,
                  "gpus": [gpu(g) for g in range(gpus)], "gpu_lost": False} if nvml else
                 {"available": False, "reason": "NVML not available: no driver"}),
        "xids": [], "xids_reason": "",
    }


def make_ctx(facts: dict[str, dict[str, Any]], cfg: CbdConfig | None = None) -> CheckContext:
    hosts = sorted(facts)
    addrs = {h: f"10.200.0.{int(h[1:])}" for h in hosts}
    return CheckContext("b1", hosts, addrs, facts, cfg or CbdConfig())


def batch(n: int = 4, **kw: Any) -> dict[str, dict[str, Any]]:
    return {f"h{i}": make_facts(i, **kw) for i in range(1, n + 1)}


ALL = (VersionsCheck, NcclEnvCheck, GpuCountCheck, GpuModesCheck, NicLinkCheck, PcieLinkCheck,
       RoutesCheck)


@pytest.mark.parametrize("check", ALL)
def test_healthy_batch_passes_every_config_check(check: Any) -> None:
    ctx = make_ctx(batch())
    for h in ctx.hosts:
        r = check().evaluate(h, ctx)
        assert r.status == "pass", (check.name, h, r.reason)


@pytest.mark.parametrize("check, reason", [
    (VersionsCheck, "no NVIDIA driver"), (GpuCountCheck, "no NVIDIA GPU"),
    (GpuModesCheck, "NVML"), (PcieLinkCheck, "link width")])
def test_no_gpu_anywhere_is_not_applicable_never_a_pass(check: Any, reason: str) -> None:
    facts = batch(nvml=False, gpus=0)
    for f in facts.values():
        f["nccl"] = None
    r = check().evaluate("h1", make_ctx(facts))
    assert r.status == "not_applicable"
    assert reason in r.reason


def test_versions_flag_the_odd_host_out() -> None:
    facts = batch()
    facts["h3"]["nvml"]["driver"] = "535.104.05"
    facts["h4"]["nccl"] = None
    ctx = make_ctx(facts)
    assert VersionsCheck().evaluate("h1", ctx).status == "pass"
    r3 = VersionsCheck().evaluate("h3", ctx)
    assert r3.status == "fail" and "driver 535.104.05 differs" in r3.reason
    r4 = VersionsCheck().evaluate("h4", ctx)
    assert r4.status == "fail" and "no nccl version" in r4.reason


def test_nccl_env_required_expected_inconsistent_and_insane() -> None:
    facts = batch()
    facts["h2"]["env"]["NCCL_IB_HCA"] = "mlx5_9"
    facts["h3"]["env"]["NCCL_IB_TIMEOUT"] = "40"
    cfg = CbdConfig(required_env=["NCCL_IB_GID_INDEX"], expected_env={"NCCL_SOCKET_IFNAME": "eth0"})
    ctx = make_ctx(facts, cfg)
    r1 = NcclEnvCheck().evaluate("h1", ctx)
    assert r1.status == "fail" and "required NCCL_IB_GID_INDEX is not set" in r1.reason
    r2 = NcclEnvCheck().evaluate("h2", ctx)
    assert "NCCL_IB_HCA=mlx5_9 here, mlx5 on 3/4 hosts" in r2.reason
    assert "matches no RDMA device" in r2.reason
    r3 = NcclEnvCheck().evaluate("h3", ctx)
    assert "NCCL_IB_TIMEOUT=40 outside [1, 31]" in r3.reason


def test_nccl_env_may_differ_list_is_ignored() -> None:
    facts = batch()
    for i, f in enumerate(facts.values()):
        f["env"]["NCCL_DEBUG_FILE"] = f"/tmp/nccl.{i}.log"
    ctx = make_ctx(facts)
    assert NcclEnvCheck().evaluate("h1", ctx).status == "pass"


@pytest.mark.parametrize("value, names, expect", [
    ("eth", ["eth0", "eth1", "ib0"], ["eth0", "eth1"]),
    ("^docker,lo", ["docker0", "lo", "eth0"], ["eth0"]),
    ("=eth0", ["eth0", "eth01"], ["eth0"]),
    ("mlx5_0:1,mlx5_1:1", ["mlx5_0", "mlx5_1", "mlx5_2"], ["mlx5_0", "mlx5_1"]),
])
def test_nccl_list_syntax(value: str, names: list[str], expect: list[str]) -> None:
    assert matches(value, names, strip_port=True) == expect
    assert parse_list("^=a,b") == (True, True, ["a", "b"])


def test_gpu_count_fails_when_a_gpu_fell_off() -> None:
    facts = batch()
    facts["h2"]["nvml"]["count"] = 7
    facts["h4"]["nvml"] = {"available": False, "reason": "NVML not available: driver gone"}
    ctx = make_ctx(facts)
    assert GpuCountCheck().evaluate("h1", ctx).status == "pass"
    assert "7 GPU(s) visible to NVML, 8 expected" in GpuCountCheck().evaluate("h2", ctx).reason
    r4 = GpuCountCheck().evaluate("h4", ctx)
    assert r4.status == "fail" and "NVML unavailable" in r4.reason


def test_gpu_modes() -> None:
    facts = batch()
    facts["h2"]["nvml"]["gpus"][3] = gpu(3, persistence=0, ecc_pending=0, sm_app_mhz=1410,
                                          clock_reasons=0x48)
    r = GpuModesCheck().evaluate("h2", make_ctx(facts))
    assert r.status == "fail"
    for part in ("gpu3: persistence mode off", "ECC mode change pending",
                 "application SM clock 1410 MHz, batch 1755", "hardware clock slowdown"):
        assert part in r.reason


def test_nic_link_mtu_majority_path_mtu_and_rdma_state() -> None:
    facts = batch()
    facts["h3"]["net"][1]["mtu"] = 9000
    facts["h4"]["ib"][2]["state"] = "1: DOWN"
    facts["h4"]["ib"][5]["rate_gbps"] = 200.0
    ctx = make_ctx(facts)
    r1 = NicLinkCheck().evaluate("h1", ctx)
    assert r1.status == "fail" and "MTU differs along the path to h3" in r1.reason
    r3 = NicLinkCheck().evaluate("h3", ctx)
    assert "MTU 9000, 1500 on 3/4 hosts" in r3.reason
    r4 = NicLinkCheck().evaluate("h4", ctx)
    assert "mlx5_2/1: state 1: DOWN" in r4.reason and "mlx5_5/1: 200 Gb/s" in r4.reason


def test_pcie_width_degradation_fails_gpu_idle_speed_is_a_note() -> None:
    facts = batch()
    f = facts["h2"]
    f["pci"][1]["cur_width"] = 8  # GPU 1 at x8
    f["pci"][2]["cur_speed"] = 2.5  # idle GPU downshift: a note only
    r = PcieLinkCheck().evaluate("h2", make_ctx(facts))
    assert r.status == "fail" and "x8 of x16" in r.reason and "2.5" not in r.reason
    assert any("2.5 of 32 GT/s" in n for n in r.evidence["notes"])
    strict = PcieLinkCheck().evaluate("h2", make_ctx(facts, CbdConfig(
        pcie_gpu_speed_strict=True, pcie_ignore=["0000:19:00.0"])))
    assert "2.5 of 32 GT/s" in strict.reason and "x8" not in strict.reason


def test_routes() -> None:
    facts = batch()
    facts["h2"]["routes"] = [{"dst": "10.9.0.0/16", "dev": "eth0", "gw": None}]
    ctx = make_ctx(facts)
    r = RoutesCheck().evaluate("h2", ctx)
    assert r.status == "fail" and "no default route" in r.reason and "no route to h1" in r.reason
    relaxed = RoutesCheck().evaluate("h2", make_ctx(copy.deepcopy(facts),
                                                    CbdConfig(require_default_route=False)))
    assert "no default route" not in relaxed.reason
