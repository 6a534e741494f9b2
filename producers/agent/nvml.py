"""GPU telemetry and XID events through NVML (pynvml from nvidia-ml-py).

Aegis §5.1 performance metrics (utilisation, SM clock, power, temperature, PCIe, NVLink)
and §4.1 critical-error evidence (ECC, retired/remapped rows, XID). Every NVML call is
guarded: a function this GPU or driver lacks (NotSupported, FunctionNotFound, missing in
the binding) leaves its metric out from then on; any other error is reported once per GPU
and call. No library or no driver: "NVML not available: <reason>" once, then the collector
stays off and the rest of the agent keeps working.

XID: an NVML event set registered for ``nvmlEventTypeXidCriticalError`` is drained with a
0 ms wait on every collection; each event becomes an agent log line in the kernel's format,
``NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, ...``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from producers.agent.collector import LogLine, Notices, Partial
from producers.agent.gpu_metrics import NOMINAL_PEAK, peak_for, put_gpu
from producers.agent.rates import RateTracker
from schemas.inventory import normalise_bus_id

SLOW_EVERY_S = 30.0  # retired pages, remapped rows, aggregate ECC change rarely
# NVML field ids (nvml.h): NVLink data throughput in KiB, cumulative, GPU-wide with
# scopeId 0; NVLink CRC flit/data, replay and recovery error totals over all lanes.
FI_NVLINK_TX, FI_NVLINK_RX = 138, 139
FI_NVLINK_ERRORS = (38, 45, 52, 59)
_UNSUPPORTED_CODES = (3, 13)  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND
_NO_PERMISSION, _GPU_LOST, _TIMEOUT = 4, 15, 10


def kernel_bus(bus_id: str) -> str:
    """NVML ``00000000:3B:00.0`` → the kernel's Xid form ``0000:3b:00``."""
    n = normalise_bus_id(bus_id)
    return n.rsplit(".", 1)[0] if n else bus_id


def xid_line(bus: str, xid: int) -> str:
    return (f"NVRM: Xid (PCI:{bus}): {xid}, pid='<unknown>', name=<unknown>, "
            "reported by aegis-agent from an NVML XID event")


def field_number(fv: Any) -> float | None:
    """The value of one nvmlFieldValue_t, or None when NVML returned an error for it."""
    if getattr(fv, "nvmlReturn", 1) != 0:
        return None
    v, t = fv.value, fv.valueType
    return float((v.dVal, v.uiVal, v.ulVal, v.ullVal, v.sllVal, v.siVal, v.usVal)[t]) \
        if 0 <= t <= 6 else None


@dataclass
class GpuState:
    index: int
    handle: Any
    dev: str
    bus: str = "unknown"
    model: str = ""
    max_sm_mhz: float | None = None
    peak: float = NOMINAL_PEAK
    unsupported: set[str] = field(default_factory=set)
    slow: dict[str, float] = field(default_factory=dict)  # last slow readings (extras too)
    slow_ts: float = float("-inf")


class NvmlCollector:
    name = "nvml"

    def __init__(self, host: str, notices: Notices | None = None, nvml: ModuleType | None = None,
                 peak_tflops: float | None = None) -> None:
        self.host = host
        self.notices = notices or Notices()
        self.nv: Any = nvml
        self.peak_override = peak_tflops
        self.gpus: list[GpuState] = []
        self.rates = RateTracker()
        self.off = False
        self.started = False
        self.event_set: Any = None

    # -- start-up -------------------------------------------------------------------------
    def start(self) -> bool:
        if self.off or self.started:
            return self.started
        try:
            if self.nv is None:
                import pynvml

                self.nv = pynvml
            self.nv.nvmlInit()
            count = int(self.nv.nvmlDeviceGetCount())
        except ImportError as e:
            return self._disable(f"the pynvml module is missing ({e}); pip install nvidia-ml-py")
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, OSError...
            return self._disable(str(e) or type(e).__name__)
        for i in range(count):
            try:
                handle = self.nv.nvmlDeviceGetHandleByIndex(i)
            except Exception as e:
                self.notices.once(f"nvml:{i}:handle", f"NVML: GPU {i} unusable: {e}")
                continue
            self.gpus.append(self._describe(GpuState(i, handle, f"{self.host}/gpu{i}")))
        if not self.gpus:
            self.notices.once("nvml:nogpu", "NVML: no GPUs found")
        self._register_xid()
        self.started = True
        return True

    def _disable(self, reason: str) -> bool:
        self.off = True
        self.notices.once("nvml:off", f"NVML not available: {reason}")
        return False

    def _describe(self, g: GpuState) -> GpuState:
        nv = self.nv
        info = self._call(g, "pci", nv.nvmlDeviceGetPciInfo, g.handle)
        if info is not None:
            bus = info.busId.decode() if isinstance(info.busId, bytes) else str(info.busId)
            g.bus = kernel_bus(bus)
        name = self._call(g, "name", nv.nvmlDeviceGetName, g.handle)
        g.model = (name.decode() if isinstance(name, bytes) else str(name or ""))
        max_sm = self._call(g, "max_sm", nv.nvmlDeviceGetMaxClockInfo, g.handle, nv.NVML_CLOCK_SM)
        g.max_sm_mhz = float(max_sm) if max_sm else None
        peak = self.peak_override or peak_for(g.model)
        if peak is None:
            self.notices.once(f"nvml:peak:{g.model}",
                              f"NVML: no peak TFLOP/s known for {g.model!r}; gpu_tensor_tflops "
                              f"uses a nominal {NOMINAL_PEAK:g} (set --gpu-peak-tflops)")
        g.peak = peak or NOMINAL_PEAK
        return g

    def _register_xid(self) -> None:
        nv = self.nv
        try:
            self.event_set = nv.nvmlEventSetCreate()
        except Exception as e:
            self.notices.once("nvml:xid", f"NVML: XID events unavailable: {e}")
            return
        for g in self.gpus:
            try:
                nv.nvmlDeviceRegisterEvents(g.handle, nv.nvmlEventTypeXidCriticalError, self.event_set)
            except Exception as e:
                self.notices.once(f"nvml:{g.index}:xid", f"NVML: XID events unavailable on GPU {g.index}: {e}")

    # -- guarded calls --------------------------------------------------------------------
    def _call(self, g: GpuState, key: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
        if key in g.unsupported:
            return None
        if fn is None:
            g.unsupported.add(key)
            return None
        try:
            return fn(*args)
        except Exception as e:
            code = getattr(e, "value", None)
            if code in _UNSUPPORTED_CODES or isinstance(e, AttributeError | NotImplementedError):
                g.unsupported.add(key)
            elif code == _NO_PERMISSION:
                g.unsupported.add(key)
                self.notices.once(f"nvml:{g.index}:{key}", f"NVML {key} on GPU {g.index}: no permission")
            elif code == _GPU_LOST:
                self.notices.once(f"nvml:{g.index}:lost", f"NVML: GPU {g.index} ({g.bus}) is lost")
            else:
                self.notices.once(f"nvml:{g.index}:{key}", f"NVML {key} on GPU {g.index}: {e}")
            return None

    def _fn(self, *names: str) -> Callable[..., Any] | None:
        for n in names:
            fn = getattr(self.nv, n, None)
            if fn is not None:
                return fn
        return None

    # -- collection -----------------------------------------------------------------------
    def collect(self, now: float) -> Partial:
        out = Partial()
        if not self.start():
            return out
        for g in self.gpus:
            gauges, counters = self._read(g, now)
            put_gpu(out, self.rates, g.dev, now, gauges, counters, g.max_sm_mhz, g.peak)
        out.logs.extend(self._drain_xid(now))
        return out

    def _read(self, g: GpuState, now: float) -> tuple[dict[str, float], dict[str, int]]:
        nv, h, call = self.nv, g.handle, self._call
        gauges: dict[str, float] = {}
        counters: dict[str, int] = {}
        util = call(g, "util", self._fn("nvmlDeviceGetUtilizationRates"), h)
        if util is not None:
            gauges["gpu_util_pct"] = float(util.gpu)
        sm = call(g, "sm_clock", self._fn("nvmlDeviceGetClockInfo"), h, nv.NVML_CLOCK_SM)
        if sm is not None:
            gauges["gpu_sm_clock_mhz"] = float(sm)
        mw = call(g, "power", self._fn("nvmlDeviceGetPowerUsage"), h)
        if mw is not None:
            gauges["gpu_power_w"] = mw / 1000.0
        temp = call(g, "temp", self._fn("nvmlDeviceGetTemperature"), h, nv.NVML_TEMPERATURE_GPU)
        if temp is not None:
            gauges["gpu_temp_c"] = float(temp)
        mem = call(g, "mem", self._fn("nvmlDeviceGetMemoryInfo"), h)
        if mem is not None:
            gauges["gpu_mem_used_gib"] = mem.used / 2**30
        for key, counter in (("gpu_pcie_rx_bps", "NVML_PCIE_UTIL_RX_BYTES"),
                             ("gpu_pcie_tx_bps", "NVML_PCIE_UTIL_TX_BYTES")):
            kbs = call(g, key, self._fn("nvmlDeviceGetPcieThroughput"), h, getattr(nv, counter, 0))
            if kbs is not None:
                gauges[key] = kbs * 1024.0  # NVML reports KB/s over a 20 ms sample
        mask = call(g, "throttle", self._fn("nvmlDeviceGetCurrentClocksEventReasons",
                                            "nvmlDeviceGetCurrentClocksThrottleReasons"), h)
        if mask is not None:
            gauges["gpu_throttle_mask"] = float(mask)
        replay = call(g, "pcie_replay", self._fn("nvmlDeviceGetPcieReplayCounter"), h)
        if replay is not None:
            counters["pcie_replay"] = int(replay)
        self._read_ecc(g, gauges, counters)
        self._read_nvlink(g, counters)
        if now - g.slow_ts >= SLOW_EVERY_S:
            self._read_slow(g)
            g.slow_ts = now
        gauges.update(g.slow)
        return gauges, counters

    def _read_ecc(self, g: GpuState, gauges: dict[str, float], counters: dict[str, int]) -> None:
        nv, fn = self.nv, self._fn("nvmlDeviceGetTotalEccErrors")
        sbe = self._call(g, "ecc_sbe", fn, g.handle, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                         nv.NVML_VOLATILE_ECC)
        if sbe is not None:
            counters["ecc_sbe_volatile"] = int(sbe)
        dbe = self._call(g, "ecc_dbe", fn, g.handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                         nv.NVML_VOLATILE_ECC)
        if dbe is not None:
            gauges["gpu_ecc_dbe_total"] = float(dbe)

    def _read_nvlink(self, g: GpuState, counters: dict[str, int]) -> None:
        if "nvlink" in g.unsupported:
            return
        ids = [FI_NVLINK_TX, FI_NVLINK_RX, *FI_NVLINK_ERRORS]
        values = self._call(g, "nvlink", self._fn("nvmlDeviceGetFieldValues"), g.handle, ids)
        if values is None:
            return
        nums = [field_number(v) for v in values]
        if all(n is None for n in nums):
            g.unsupported.add("nvlink")  # no NVLink on this GPU
            return
        if nums[0] is not None:
            counters["nvlink_tx_kib"] = int(nums[0])
        if nums[1] is not None:
            counters["nvlink_rx_kib"] = int(nums[1])
        errs = [n for n in nums[2:] if n is not None]
        if errs:
            counters["nvlink_errors"] = int(sum(errs))

    def _read_slow(self, g: GpuState) -> None:
        nv, h = self.nv, g.handle
        fn = self._fn("nvmlDeviceGetTotalEccErrors")
        for metric, kind in (("gpu_ecc_sbe_aggregate_total", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                             ("gpu_ecc_dbe_aggregate_total", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED")):
            v = self._call(g, metric, fn, h, getattr(nv, kind), nv.NVML_AGGREGATE_ECC)
            if v is not None:
                g.slow[metric] = float(v)
        retired: float | None = None
        pages = self._fn("nvmlDeviceGetRetiredPages")
        for cause in (0, 1):  # multiple single-bit, double-bit
            got = self._call(g, f"retired{cause}", pages, h, cause)
            if got is not None:
                retired = (retired or 0.0) + len(got)
        rows = self._call(g, "remapped", self._fn("nvmlDeviceGetRemappedRows"), h)
        if rows is not None:
            corr, unc, pending, failure = rows[:4]
            retired = (retired or 0.0) + corr + unc
            g.slow["gpu_remap_pending"] = float(pending)
            g.slow["gpu_remap_failure"] = float(failure)
        if retired is not None:
            g.slow["gpu_retired_rows"] = retired

    def _drain_xid(self, now: float, limit: int = 256) -> list[LogLine]:
        if self.event_set is None:
            return []
        lines: list[LogLine] = []
        xid_bit = getattr(self.nv, "nvmlEventTypeXidCriticalError", 8)
        for _ in range(limit):
            try:
                ev = self.nv.nvmlEventSetWait(self.event_set, 0)
            except Exception as e:
                if getattr(e, "value", None) != _TIMEOUT:
                    self.notices.once("nvml:xidwait", f"NVML: XID event wait failed: {e}")
                break
            if not int(ev.eventType) & xid_bit:
                continue
            bus = "unknown"
            try:
                info = self.nv.nvmlDeviceGetPciInfo(ev.device)
                bus = kernel_bus(info.busId.decode() if isinstance(info.busId, bytes) else str(info.busId))
            except Exception:
                pass
            lines.append(LogLine(now, "agent", xid_line(bus, int(ev.eventData))))
        return lines

    def inventory(self) -> list[dict[str, Any]]:
        return [{"id": g.dev, "bus": g.bus, "model": g.model, "peak_tflops": g.peak}
                for g in self.gpus]

    def close(self) -> None:
        if not self.started:
            return
        try:
            if self.event_set is not None:
                self.nv.nvmlEventSetFree(self.event_set)
            self.nv.nvmlShutdown()
        except Exception:
            pass
        self.started = False
