"""The NVML collector against a stand-in pynvml module (no GPU on the test machine)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from producers.agent.collector import Notices
from producers.agent.nvml import NvmlCollector, kernel_bus, xid_line


class FakeError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(n: int = 2, unsupported: tuple[str, ...] = (), xids: list[tuple[int, int]] | None = None,
              init_error: int | None = None) -> Any:
    """A module with the pynvml names the collector uses; handles are ints."""
    state = {"replay": 0, "sbe": 0, "tx": 0}
    events = list(xids or [])
    m = types.SimpleNamespace(NVML_CLOCK_SM=1, NVML_TEMPERATURE_GPU=0, NVML_PCIE_UTIL_TX_BYTES=0,
                              NVML_PCIE_UTIL_RX_BYTES=1, NVML_MEMORY_ERROR_TYPE_CORRECTED=0,
                              NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0,
                              NVML_AGGREGATE_ECC=1, nvmlEventTypeXidCriticalError=8)

    def fn(name: str, impl: Any) -> None:
        def call(*a: Any) -> Any:
            if name in unsupported:
                raise FakeError(3)  # NVML_ERROR_NOT_SUPPORTED
            return impl(*a)
        setattr(m, name, call)

    def init() -> None:
        if init_error is not None:
            raise FakeError(init_error)

    def field_values(h: int, ids: list[int]) -> list[Any]:
        state["tx"] += 1_000
        out = []
        for fid in ids:
            ok = fid in (138, 139, 38)
            val = types.SimpleNamespace(dVal=0.0, uiVal=0, ulVal=0, ullVal=state["tx"] if fid != 38 else 2,
                                        sllVal=0, siVal=0, usVal=0)
            out.append(types.SimpleNamespace(nvmlReturn=0 if ok else 3, valueType=3, value=val))
        return out

    def ecc(h: int, kind: int, counter: int) -> int:
        if kind == 0 and counter == 0:
            state["sbe"] += 10
            return state["sbe"]
        return 1 if kind == 1 else 0

    def wait(es: Any, timeout: int) -> Any:
        if not events:
            raise FakeError(10)  # NVML_ERROR_TIMEOUT
        h, xid = events.pop(0)
        return types.SimpleNamespace(device=h, eventType=8, eventData=xid)

    def replay(h: int) -> int:
        state["replay"] += 4
        return state["replay"]

    m.nvmlInit = init
    fn("nvmlShutdown", lambda: None)
    fn("nvmlDeviceGetCount", lambda: n)
    fn("nvmlDeviceGetHandleByIndex", lambda i: i)
    fn("nvmlDeviceGetPciInfo", lambda h: types.SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode()))
    fn("nvmlDeviceGetName", lambda h: b"NVIDIA H100 80GB HBM3")
    fn("nvmlDeviceGetMaxClockInfo", lambda h, t: 1980)
    fn("nvmlDeviceGetUtilizationRates", lambda h: types.SimpleNamespace(gpu=50, memory=20))
    fn("nvmlDeviceGetClockInfo", lambda h, t: 990)
    fn("nvmlDeviceGetPowerUsage", lambda h: 350_000)
    fn("nvmlDeviceGetTemperature", lambda h, s: 61)
    fn("nvmlDeviceGetMemoryInfo", lambda h: types.SimpleNamespace(used=3 * 2**30, total=80 * 2**30))
    fn("nvmlDeviceGetPcieThroughput", lambda h, c: 1000)
    fn("nvmlDeviceGetCurrentClocksEventReasons", lambda h: 0x4)
    fn("nvmlDeviceGetPcieReplayCounter", replay)
    fn("nvmlDeviceGetTotalEccErrors", ecc)
    fn("nvmlDeviceGetFieldValues", field_values)
    fn("nvmlDeviceGetRetiredPages", lambda h, cause: [0x1000] if cause == 1 else [])
    fn("nvmlDeviceGetRemappedRows", lambda h: (2, 1, 0, 0))
    fn("nvmlEventSetCreate", lambda: "evset")
    fn("nvmlDeviceRegisterEvents", lambda h, t, es: None)
    fn("nvmlEventSetWait", wait)
    fn("nvmlEventSetFree", lambda es: None)
    return m


def test_not_available_is_said_once_and_stays_off() -> None:
    seen: list[str] = []
    c = NvmlCollector("h1", Notices(seen.append), fake_nvml(init_error=12))
    assert c.collect(1.0).devices == {} and c.collect(2.0).devices == {}
    assert seen == ["NVML not available: NVML error 12"]


def test_metrics_and_rates() -> None:
    c = NvmlCollector("h1", Notices(lambda _: None), fake_nvml())
    first = c.collect(10.0).devices["gpu"]["h1/gpu1"]
    assert first["gpu_util_pct"] == 50.0 and first["gpu_power_w"] == 350.0
    assert first["gpu_mem_used_gib"] == 3.0 and first["gpu_pcie_rx_bps"] == 1000 * 1024
    assert first["gpu_throttle_mask"] == 4.0 and first["gpu_ecc_dbe_total"] == 1.0
    assert first["gpu_retired_rows"] == 1 + 2 + 1  # one DBE page + remapped rows 2 + 1
    assert first["gpu_tensor_tflops"] == pytest.approx(0.5 * 0.5 * 989.0)
    assert "gpu_pcie_replay_per_s" not in first  # rates need a second reading
    m = c.collect(12.0).devices["gpu"]["h1/gpu1"]
    assert m["gpu_pcie_replay_per_s"] == pytest.approx(8 / 2)  # 2 GPUs share the fake counter
    assert m["gpu_ecc_sbe_per_s"] == pytest.approx(20 / 2)
    assert m["gpu_nvlink_tx_bps"] == pytest.approx(2_000 * 1024 / 2)
    assert m["gpu_nvlink_err_per_s"] == 0.0
    assert [g["bus"] for g in c.inventory()] == ["0000:18:00", "0000:19:00"]


def test_unsupported_calls_leave_metrics_out() -> None:
    seen: list[str] = []
    nv = fake_nvml(unsupported=("nvmlDeviceGetPowerUsage", "nvmlDeviceGetFieldValues",
                                "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPages"))
    del nv.nvmlDeviceGetCurrentClocksEventReasons  # an older binding: fall back
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x8
    c = NvmlCollector("h1", Notices(seen.append), nv)
    c.collect(1.0)
    m = c.collect(2.0).devices["gpu"]["h1/gpu0"]
    assert "gpu_power_w" not in m and "gpu_nvlink_tx_bps" not in m and "gpu_retired_rows" not in m
    assert m["gpu_throttle_mask"] == 8.0 and m["gpu_temp_c"] == 61.0
    assert seen == []  # "not supported" is not a problem worth a line


def test_xid_events_become_kernel_style_lines() -> None:
    c = NvmlCollector("h1", Notices(lambda _: None), fake_nvml(xids=[(1, 79), (0, 48)]))
    logs = c.collect(5.0).logs
    assert [(x.source, x.ts) for x in logs] == [("agent", 5.0), ("agent", 5.0)]
    assert logs[0].line.startswith("NVRM: Xid (PCI:0000:19:00): 79, ")
    assert logs[1].line.startswith("NVRM: Xid (PCI:0000:18:00): 48, ")
    assert c.collect(6.0).logs == []


def test_unexpected_errors_are_reported_once_per_call() -> None:
    seen: list[str] = []
    nv = fake_nvml(n=1)

    def broken(h: int) -> Any:
        raise FakeError(999)

    nv.nvmlDeviceGetUtilizationRates = broken
    c = NvmlCollector("h1", Notices(seen.append), nv)
    for t in (1.0, 2.0, 3.0):
        assert "gpu_util_pct" not in c.collect(t).devices["gpu"]["h1/gpu0"]
    assert seen == ["NVML util on GPU 0: NVML error 999"]


@pytest.mark.parametrize(("bus", "kernel"), [
    ("00000000:3B:00.0", "0000:3b:00"), ("0000:b3:00.0", "0000:b3:00"), ("weird", "weird")])
def test_kernel_bus(bus: str, kernel: str) -> None:
    assert kernel_bus(bus) == kernel
    assert xid_line(kernel, 79).startswith(f"NVRM: Xid (PCI:{kernel}): 79, pid='<unknown>'")
