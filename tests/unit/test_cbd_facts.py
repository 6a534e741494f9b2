"""The on-host fact collector's readers, over fixture trees and a fake NVML."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from producers.cbd import facts
from producers.cbd import facts_view as fv
from producers.cbd.nvml_facts import read_nvml

SYSFS = str(Path(__file__).resolve().parent.parent / "data" / "sysfs")


def test_read_ib_from_fixture() -> None:
    ports = facts.read_ib(SYSFS)
    assert [p["dev"] for p in ports] == [f"mlx5_{i}" for i in range(8)]
    p = ports[0]
    assert p["state"] == "4: ACTIVE" and "LinkUp" in p["phys_state"]
    assert p["rate_gbps"] == 400.0 and p["link_layer"] == "Ethernet"


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text + "\n")


def test_read_pci_and_net(tmp_path: Path) -> None:
    gpu = "bus/pci/devices/0000:18:00.0"
    for k, v in {"class": "0x030200", "vendor": "0x10de", "current_link_width": "8",
                 "max_link_width": "16", "current_link_speed": "16.0 GT/s PCIe",
                 "max_link_speed": "32.0 GT/s PCIe"}.items():
        _write(tmp_path, f"{gpu}/{k}", v)
    nic = "bus/pci/devices/0000:19:00.0"
    for k, v in {"class": "0x020000", "vendor": "0x15b3", "current_link_width": "16",
                 "max_link_width": "16", "current_link_speed": "Unknown"}.items():
        _write(tmp_path, f"{nic}/{k}", v)
    (tmp_path / nic / "net" / "enp25s0np0").mkdir(parents=True)
    _write(tmp_path, "bus/pci/devices/0000:00:00.0/class", "0x060000")
    pci = facts.read_pci(str(tmp_path))
    assert [(p["kind"], p["cur_width"], p["cur_speed"]) for p in pci] == [
        ("gpu", 8, 16.0), ("nic", 16, None)]
    assert pci[1]["netdevs"] == ["enp25s0np0"]
    for k, v in {"operstate": "up", "carrier": "1", "mtu": "9000", "speed": "-1"}.items():
        _write(tmp_path, f"class/net/eth0/{k}", v)
    (net,) = facts.read_net(str(tmp_path))
    assert net == {"name": "eth0", "operstate": "up", "carrier": 1, "mtu": 9000,
                   "speed_mbps": None, "virtual": True, "pci": None}


def test_parse_proc_route() -> None:
    text = ("Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
            "eth0\t00000000\tFE00C80A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
            "eth0\t0000C80A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n")
    assert facts.parse_proc_route(text) == [
        {"dst": "default", "dev": "eth0", "gw": "10.200.0.254"},
        {"dst": "10.200.0.0/24", "dev": "eth0", "gw": None}]


def test_xids_from_kmsg() -> None:
    recs = ["4,100,5000000,-;NVRM: Xid (PCI:0000:3B:00): 79, pid=1, GPU has fallen off the bus.",
            "6,101,6000000,-;eth0: link up", "garbage"]
    (x,) = facts.xids_from_kmsg(recs, uptime_s=65.0)
    assert x["xid"] == 79 and x["bus"] == "0000:3b:00" and x["age_s"] == 60.0


def test_env_and_nccl_conf_and_version(tmp_path: Path) -> None:
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_IB_HCA=mlx5_0\nNCCL_DEBUG=WARN  # comment\nOTHER=1\n")
    env = facts.read_env({"NCCL_IB_HCA": "mlx5", "PATH": "/bin", "UCX_TLS": "rc"},
                         ("NCCL_", "UCX_"), [str(conf)])
    assert env == {"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": "mlx5", "UCX_TLS": "rc"}
    (tmp_path / "libnccl.so.2.21.5").write_text("")
    assert facts.nccl_version({}, [str(tmp_path)]) == {
        "version": "2.21.5", "source": str(tmp_path / "libnccl.so.2.21.5")}
    assert facts.nccl_version({"NCCL_VERSION": "2.23.4"}, []) == {
        "version": "2.23.4", "source": "env NCCL_VERSION"}
    assert facts.nccl_version({}, [str(tmp_path / "none")]) is None


class _NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"nvml error {value}")
        self.value = value


def fake_nvml(n: int = 2, lost_gpu: int | None = None) -> types.ModuleType:
    m = types.ModuleType("fake_pynvml")
    m.NVMLError = _NVMLError  # type: ignore[attr-defined]
    m.NVML_CLOCK_SM, m.NVML_TEMPERATURE_GPU = 1, 0  # type: ignore[attr-defined]
    m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, m.NVML_VOLATILE_ECC = 1, 0  # type: ignore[attr-defined]
    m.NVML_NVLINK_MAX_LINKS = 4  # type: ignore[attr-defined]

    def not_supported(*_a: Any) -> Any:
        raise _NVMLError(3)

    def temp(h: int, _s: int) -> int:
        if h == lost_gpu:
            raise _NVMLError(15)
        return 40

    funcs = {
        "nvmlInit": lambda: None, "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: n, "nvmlSystemGetDriverVersion": lambda: b"550.54.15",
        "nvmlSystemGetCudaDriverVersion": lambda: 12040,
        "nvmlDeviceGetHandleByIndex": lambda i: i, "nvmlDeviceGetName": lambda h: "H100",
        "nvmlDeviceGetPciInfo": lambda h: types.SimpleNamespace(busId=f"00000000:{h + 0x18:02X}:00.0"),
        "nvmlDeviceGetPersistenceMode": lambda h: 1, "nvmlDeviceGetEccMode": lambda h: [1, 1],
        "nvmlDeviceGetRemappedRows": lambda h: (0, 0, h == 1, False),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 1,
        "nvmlDeviceGetClockInfo": lambda h, c: 345, "nvmlDeviceGetMaxClockInfo": lambda h, c: 1980,
        "nvmlDeviceGetApplicationsClock": not_supported, "nvmlDeviceGetTemperature": temp,
        "nvmlDeviceGetTotalEccErrors": lambda h, t, c: 0,
        "nvmlDeviceGetRetiredPagesPendingStatus": lambda h: 0,
        "nvmlDeviceGetNvLinkState": lambda h, k: 1 if k < 3 else 0,
    }
    for k, v in funcs.items():
        setattr(m, k, v)
    return m


def test_read_nvml_with_fake_library() -> None:
    out = read_nvml(fake_nvml(2, lost_gpu=1))
    assert out["available"] and out["driver"] == "550.54.15" and out["cuda"] == "12.4"
    g0, g1 = out["gpus"]
    assert g0["bus"] == "00000000:18:00.0" and g0["sm_app_mhz"] is None  # not supported
    assert g0["pcie_width"] is None  # missing in the binding
    assert g0["nvlinks"] == {"active": 3, "inactive": 1}
    assert g1["remap"]["pending"] is True
    assert "error" in g1["temp_c"] and out["gpu_lost"] is True


def test_read_nvml_init_failure() -> None:
    m = fake_nvml()

    def boom() -> None:
        raise _NVMLError(9)

    m.nvmlInit = boom  # type: ignore[attr-defined]
    out = read_nvml(m)
    assert out == {"available": False, "reason": "NVML not available: nvml error 9"}


def test_collector_runs_as_a_program() -> None:
    p = subprocess.run([sys.executable, "-m", "producers.cbd.facts", "--no-nvml"],
                       capture_output=True, text=True, timeout=60, check=True)
    doc = json.loads(p.stdout)
    for key in ("net", "ib", "pci", "routes", "addrs", "env", "tools", "nvml", "xids"):
        assert key in doc
    assert any(n["name"] == "lo" for n in doc["net"])


@pytest.mark.parametrize("addr, dev", [("10.200.0.7", "eth0"), ("8.8.8.8", "eth1"),
                                       ("10.1.2.3", "ib0"), ("bogus", None)])
def test_route_for(addr: str, dev: str | None) -> None:
    routes = [{"dst": "default", "dev": "eth1", "gw": "1.1.1.1"},
              {"dst": "10.200.0.0/24", "dev": "eth0"}, {"dst": "10.0.0.0/8", "dev": "ib0"}]
    r = fv.route_for(routes, addr)
    assert (r or {}).get("dev") == dev


def test_mode_ties_are_deterministic() -> None:
    assert fv.mode(["b", "a", None, "b", "a"]) == ("a", 2, 4)
    assert fv.mode([None]) == (None, 0, 0)
