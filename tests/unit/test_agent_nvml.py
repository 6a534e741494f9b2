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


LINKS = 4  # NVLinks per fake GPU
ALL_LINKS = 0xFFFFFFFF  # nvml.h: "A scopeId of UINT_MAX returns aggregate value ... across all links"


def fake_nvml(n: int = 2, unsupported: tuple[str, ...] = (), xids: list[tuple[int, int]] | None = None,
              init_error: int | None = None) -> Any:
    """A module with the pynvml names the collector uses; handles are ints. ``m.broken[h]``
    makes every call about GPU h raise that NVML error code; ``m.calls[h]`` counts them."""
    state = {"replay": 0, "sbe": 0, "tx": 0}
    events = list(xids or [])
    m = types.SimpleNamespace(NVML_CLOCK_SM=1, NVML_TEMPERATURE_GPU=0, NVML_PCIE_UTIL_TX_BYTES=0,
                              NVML_PCIE_UTIL_RX_BYTES=1, NVML_MEMORY_ERROR_TYPE_CORRECTED=0,
                              NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0,
                              NVML_AGGREGATE_ECC=1, nvmlEventTypeXidCriticalError=8)

    m.broken, m.calls = {}, {}

    def fn(name: str, impl: Any) -> None:
        def call(*a: Any) -> Any:
            if name in unsupported:
                raise FakeError(3)  # NVML_ERROR_NOT_SUPPORTED
            if name.startswith("nvmlDevice") and a and isinstance(a[0], int) and name != "nvmlDeviceGetHandleByIndex":
                m.calls[a[0]] = m.calls.get(a[0], 0) + 1
                if a[0] in m.broken:
                    raise FakeError(m.broken[a[0]])
            return impl(*a)
        setattr(m, name, call)

    def init() -> None:
        if init_error is not None:
            raise FakeError(init_error)

    def field_values(h: int, ids: list[Any]) -> list[Any]:
        state["tx"] += 1_000  # per link and call
        out = []
        for entry in ids:  # pynvml: an int, or (fieldId, scopeId)
            fid, scope = entry if isinstance(entry, tuple) else (entry, 0)
            links = LINKS if scope == ALL_LINKS else (1 if scope < LINKS else 0)
            ok = fid == 38 or (fid in (138, 139) and links > 0)
            val = types.SimpleNamespace(dVal=0.0, uiVal=0, ulVal=0,
                                        ullVal=state["tx"] * links if fid != 38 else 2,
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
    assert m["gpu_nvlink_tx_bps"] == pytest.approx(LINKS * 2_000 * 1024 / 2)  # every link
    assert m["gpu_nvlink_err_per_s"] == 0.0
    assert [g["bus"] for g in c.inventory()] == ["0000:18:00.0", "0000:19:00.0"]


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


def test_nvlink_throughput_is_read_over_all_links() -> None:
    asked: list[Any] = []
    nv = fake_nvml(n=1)
    real = nv.nvmlDeviceGetFieldValues
    nv.nvmlDeviceGetFieldValues = lambda h, ids: (asked.append(list(ids)), real(h, ids))[1]
    c = NvmlCollector("h1", Notices(lambda _: None), nv)
    c.collect(1.0)
    m = c.collect(2.0).devices["gpu"]["h1/gpu0"]
    # scopeId 0 would be link 0 alone; UINT_MAX is the sum over the GPU's links
    assert (138, ALL_LINKS) in asked[0] and (139, ALL_LINKS) in asked[0]
    assert m["gpu_nvlink_rx_bps"] == pytest.approx(LINKS * 1_000 * 1024)


def test_a_name_the_driver_lacks_falls_back_to_the_other_name() -> None:
    seen: list[str] = []
    nv = fake_nvml(n=1)

    def missing(*a: Any) -> Any:
        raise FakeError(13)  # NVMLError_FunctionNotFound: the binding has it, the driver not

    nv.nvmlDeviceGetCurrentClocksEventReasons = missing  # a driver before r535
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x20
    nv.nvmlDeviceGetTemperature = missing  # a driver after the deprecated name went away
    nv.nvmlDeviceGetTemperatureV = lambda h, sensor: 58
    c = NvmlCollector("h1", Notices(seen.append), nv)
    for t in (1.0, 2.0):
        m = c.collect(t).devices["gpu"]["h1/gpu0"]
        assert m["gpu_throttle_mask"] == 0x20 and m["gpu_temp_c"] == 58.0
    assert seen == []


def test_a_gpu_that_falls_off_the_bus_is_marked_once_and_left_alone() -> None:
    from processors.core.log_classifier import classify

    seen: list[str] = []
    nv = fake_nvml(n=2)
    c = NvmlCollector("h1", Notices(seen.append), nv)
    c.collect(0.0)
    c.collect(1.0)
    nv.broken[1] = 15  # NVML_ERROR_GPU_IS_LOST from every call about GPU 1
    gpus = c.collect(2.0).devices["gpu"]
    assert "h1/gpu1" not in gpus and "gpu_util_pct" in gpus["h1/gpu0"]  # no stale slow values
    lost = [m for m in seen if "lost" in m]
    assert lost == ["NVML: GPU 1 (PCI 0000:19:00.0): GPU is lost; its metrics are left out, "
                    "asked again every 30 s"]
    ev = classify(f"aegis-agent notice: {lost[0]}", "agent")
    assert (ev.rule, ev.severity, ev.action) == ("gpu_lost", "fatal", "isolate_host")
    calls = nv.calls[1]
    for t in range(3, 32):  # not asked again before 30 s, nothing more said
        assert "h1/gpu1" not in c.collect(float(t)).devices["gpu"]
    assert nv.calls[1] == calls and len(seen) == 1
    del nv.broken[1]  # it answers again (GPU reset)
    back = c.collect(32.0).devices["gpu"]["h1/gpu1"]
    assert "gpu_util_pct" in back and "gpu_pcie_replay_per_s" not in back  # re-baselined
    assert seen[-1] == "NVML: GPU 1 (0000:19:00.0) answers again"


def test_a_gpu_failing_every_call_is_one_notice_not_one_per_call() -> None:
    seen: list[str] = []
    nv = fake_nvml(n=2)
    c = NvmlCollector("h1", Notices(seen.append), nv)
    c.collect(0.0)
    nv.broken[0] = 999  # NVML_ERROR_UNKNOWN everywhere, as after a fall off the bus
    for t in (1.0, 2.0, 3.0):
        assert "h1/gpu0" not in c.collect(t).devices["gpu"]
    assert len(seen) == 1 and seen[0].startswith("NVML: GPU 0 (PCI 0000:18:00.0): no NVML call answered")


def test_xid_of_a_gpu_that_no_longer_answers_names_its_bus() -> None:
    from processors.core.log_classifier import classify
    from schemas.inventory import Inventory

    nv = fake_nvml(n=2, xids=[(1, 79)])
    c = NvmlCollector("h1", Notices(lambda _: None), nv)
    c.start(0.0)
    nv.broken[1] = 15  # XID 79: nvmlDeviceGetPciInfo no longer answers for this GPU
    line = c.collect(1.0).logs[0].line
    assert line.startswith("NVRM: Xid (PCI:0000:19:00): 79, ")
    # the --once inventory's bus ids are the inventory file's form: the XID maps to GPU 1
    inv = Inventory.from_wire({"hosts": [{"host": "h1", "gpu_bus_ids": [g["bus"] for g in c.inventory()]}]})
    ev = classify(line, "agent", inv.hosts["h1"])
    assert (ev.rule, ev.gpu, ev.pci_bus_id) == ("xid_79", 1, "0000:19:00.0")


def test_nvml_init_is_retried_when_the_driver_comes_later() -> None:
    seen: list[str] = []
    nv = fake_nvml(init_error=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    c = NvmlCollector("h1", Notices(seen.append), nv)
    assert c.collect(100.0).devices == {} and c.collect(101.0).devices == {}
    nv.nvmlInit = lambda: None  # the driver container finished
    assert c.collect(159.0).devices == {}  # not retried before 60 s
    assert "h1/gpu0" in c.collect(160.0).devices["gpu"]
    assert seen == ["NVML not available: NVML error 9", "NVML is available now"]


def test_a_missing_binding_is_final() -> None:
    import builtins

    seen: list[str] = []
    real_import = builtins.__import__

    def no_pynvml(name: str, *a: Any, **k: Any) -> Any:
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *a, **k)

    c = NvmlCollector("h1", Notices(seen.append))
    builtins.__import__ = no_pynvml
    try:
        assert c.collect(1.0).devices == {} and c.collect(1000.0).devices == {}
    finally:
        builtins.__import__ = real_import
    assert len(seen) == 1 and "pynvml module is missing" in seen[0]
