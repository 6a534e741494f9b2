"""GPU telemetry and XID events through NVML (pynvml from nvidia-ml-py).

Aegis §5.1 performance metrics (utilisation, SM clock, power, temperature, PCIe, NVLink)
and §4.1 critical-error evidence (ECC, retired/remapped rows, XID). Every NVML call is
guarded: a query this GPU doesn't support (NotSupported), or that neither the binding nor the
driver has, leaves its metric out from then on; a name the driver lacks (FunctionNotFound)
falls back to NVML's other name for it (ClocksEventReasons/ClocksThrottleReasons around
r535, Temperature/TemperatureV). Other errors are said once per GPU and call. A GPU that
answers ``GPU is lost``, or fails every call of a sample, is marked lost: one notice in the
words of the log classifier's gpu_lost rule, its metrics left out, asked again every 30 s.
No library or no driver: "NVML not available: <reason>" once; nvmlInit is retried every
60 s (a driver container that starts after the agent), the rest of the agent keeps working.

XID: an NVML event set registered for ``nvmlEventTypeXidCriticalError`` is drained with a
0 ms wait on every collection; each event becomes an agent log line in the kernel's format,
``NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, ...``, with the bus id
learnt at start (a GPU that raised XID 79 no longer answers nvmlDeviceGetPciInfo).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from producers.agent.collector import LogLine, Notices, Partial
from producers.agent.gpu_metrics import (
    NOMINAL_PEAK,
    field_number,
    handle_key,
    kernel_bus,
    peak_for,
    put_gpu,
    xid_line,
)
from producers.agent.rates import RateTracker
from schemas.inventory import normalise_bus_id

__all__ = ["NvmlCollector", "field_number", "handle_key", "kernel_bus", "xid_line"]

SLOW_EVERY_S = 30.0  # retired pages, remapped rows, aggregate ECC change rarely
LOST_PROBE_S = 30.0  # a lost GPU is asked again this often
INIT_RETRY_S = 60.0  # nvmlInit is retried this often while the driver is not there
# NVML field ids (nvml.h): NVLink data throughput in KiB, cumulative; "Link ID needs to be
# specified in the scopeId field ... A scopeId of UINT_MAX returns aggregate value summed up
# across all links" (scopeId 0 is link 0 alone). NVLink CRC flit/data, replay and recovery
# error totals over all links (no scope).
FI_NVLINK_TX, FI_NVLINK_RX = 138, 139
SCOPE_ALL_LINKS = 0xFFFFFFFF
FI_NVLINK_ERRORS = (38, 45, 52, 59)
# nvmlReturn_t codes (pynvml NVML_ERROR_*)
_NOT_SUPPORTED, _NO_PERMISSION, _TIMEOUT, _FN_NOT_FOUND, _GPU_LOST = 3, 4, 10, 13, 15


def _bus_text(info: Any) -> str:
    """nvmlPciInfo_t.busId as text (the binding returns bytes)."""
    return info.busId.decode() if isinstance(info.busId, bytes) else str(info.busId)


@dataclass
class GpuState:
    index: int
    handle: Any
    dev: str
    bus: str = "unknown"  # normalised ``0000:3b:00.0``, the inventory's form
    model: str = ""
    max_sm_mhz: float | None = None
    peak: float = NOMINAL_PEAK
    unsupported: set[str] = field(default_factory=set)
    slow: dict[str, float] = field(default_factory=dict)  # last slow readings (extras too)
    slow_ts: float = float("-inf")
    lost: bool = False
    probe_at: float = float("-inf")
    # per sample: calls answered, the lost code seen, other errors (notice key, message)
    answered: int = 0
    gone: bool = False
    errors: list[tuple[str, str]] = field(default_factory=list)


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
        self.retry_at = float("-inf")
        self.started = False
        self.event_set: Any = None

    # -- start-up -------------------------------------------------------------------------
    def start(self, now: float | None = None) -> bool:
        if self.started:
            return True
        if self.off or (now is not None and now < self.retry_at):
            return False
        try:
            if self.nv is None:
                import pynvml

                self.nv = pynvml
            self.nv.nvmlInit()
            count = int(self.nv.nvmlDeviceGetCount())
        except ImportError as e:
            self.off = True  # no binding: nothing will change while the agent runs
            self.notices.once("nvml:off", f"NVML not available: the pynvml module is missing ({e}); "
                              "pip install nvidia-ml-py")
            return False
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, OSError...
            # the driver may come later (a driver container, a module load): retry
            self.retry_at = (now if now is not None else 0.0) + INIT_RETRY_S
            self.notices.once("nvml:off", f"NVML not available: {str(e) or type(e).__name__}")
            return False
        self.notices.clear("nvml:off", "NVML is available now")
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

    def _describe(self, g: GpuState) -> GpuState:
        nv = self.nv
        info = self._call(g, "pci", nv.nvmlDeviceGetPciInfo, g.handle)
        if info is not None:
            bus = _bus_text(info)
            g.bus = normalise_bus_id(bus) or bus
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
        self._settle(g, float("-inf"))  # a GPU lost already at start is asked at once
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
    def _call(self, g: GpuState, key: str, fn: Callable[..., Any] | None
              | tuple[Callable[..., Any] | None, ...], *args: Any) -> Any:
        """``fn(*args)``, or None. A tuple of functions is tried in order while the driver or
        the binding lacks the name (FunctionNotFound); a GPU that doesn't support the query
        drops ``key`` for good. Other errors are kept for :meth:`_settle`."""
        if key in g.unsupported:
            return None
        for f in fn if isinstance(fn, tuple) else (fn,):
            if f is None:
                continue
            try:
                out = f(*args)
            except Exception as e:
                code = getattr(e, "value", None)
                if code == _FN_NOT_FOUND or isinstance(e, AttributeError | NotImplementedError):
                    continue  # this driver lacks the name: the next one, if any
                if code == _NOT_SUPPORTED:
                    g.unsupported.add(key)
                elif code == _NO_PERMISSION:
                    g.unsupported.add(key)
                    self.notices.once(f"nvml:{g.index}:{key}", f"NVML {key} on GPU {g.index}: no permission")
                elif code == _GPU_LOST:
                    g.gone = True
                else:
                    g.errors.append((f"nvml:{g.index}:{key}", f"NVML {key} on GPU {g.index}: {e}"))
                return None
            g.answered += 1
            self.notices.clear(f"nvml:{g.index}:{key}")  # re-armed: a later failure is said again
            return out
        g.unsupported.add(key)  # neither the binding nor the driver has it
        return None

    def _fn(self, *names: str) -> tuple[Callable[..., Any] | None, ...]:
        return tuple(getattr(self.nv, n, None) for n in names)

    def _settle(self, g: GpuState, now: float) -> bool:
        """After a GPU's sample: True when it answered. ``GPU is lost``, or every call of the
        sample failing, marks it lost once (one notice, in words the log classifier's
        gpu_lost rule knows, with the bus id); it is asked again every LOST_PROBE_S."""
        gone, errors, answered = g.gone, g.errors, g.answered
        g.gone, g.errors, g.answered = False, [], 0
        if not gone and (answered or not errors):
            for key, message in errors:
                self.notices.once(key, message)
            if g.lost:
                g.lost = False
                self.notices.clear(f"nvml:{g.index}:lost", f"NVML: GPU {g.index} ({g.bus}) answers again")
            return True
        why = "GPU is lost" if gone else f"no NVML call answered ({errors[0][1]})"
        g.lost, g.probe_at = True, now + LOST_PROBE_S
        g.slow.clear()  # never republish a lost GPU's last slow readings
        g.slow_ts = float("-inf")
        self.rates.forget(lambda k: isinstance(k, tuple) and k[0] == g.dev)
        self.notices.once(f"nvml:{g.index}:lost", f"NVML: GPU {g.index} (PCI {g.bus}): {why}; its "
                          f"metrics are left out, asked again every {LOST_PROBE_S:g} s")
        return False

    # -- collection -----------------------------------------------------------------------
    def collect(self, now: float) -> Partial:
        out = Partial()
        if not self.start(now):
            return out
        for g in self.gpus:
            if g.lost and now < g.probe_at:
                continue
            gauges, counters = self._read(g, now)
            if self._settle(g, now):
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
        temp = call(g, "temp", self._fn("nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV"), h,
                    nv.NVML_TEMPERATURE_GPU)
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
        ids = [(FI_NVLINK_TX, SCOPE_ALL_LINKS), (FI_NVLINK_RX, SCOPE_ALL_LINKS), *FI_NVLINK_ERRORS]
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
            bus = self._bus_of(ev.device)
            lines.append(LogLine(now, "agent", xid_line(bus, int(ev.eventData))))
        return lines

    def _bus_of(self, handle: Any) -> str:
        """The kernel-form bus id of an event's device: learnt at start, since a GPU that
        raised XID 79 no longer answers nvmlDeviceGetPciInfo."""
        key = handle_key(handle)
        for g in self.gpus:
            if handle_key(g.handle) == key and g.bus != "unknown":
                return kernel_bus(g.bus)
        try:
            info = self.nv.nvmlDeviceGetPciInfo(handle)
            return kernel_bus(_bus_text(info))
        except Exception:
            return "unknown"

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
