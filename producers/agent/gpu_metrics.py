"""Shared by the NVML collector and the simulated one: raw GPU readings → catalogue metrics.

Gauges pass through under their metric name; cumulative counters become rates through
:class:`~producers.agent.rates.RateTracker`. The tensor-throughput estimate (Aegis §5.1
"tensor FLOPS") is ``util/100 × SM clock / max SM clock × peak dense BF16 TFLOP/s`` of the
model: NVML has no tensor-activity counter (DCGM's PIPE_TENSOR_ACTIVE needs the DCGM
profiling module), so this is an activity-weighted upper bound. It is only ever compared
across the hosts of one job, which run the same model, so a wrong peak scales every host
alike and never flags one.
"""

from __future__ import annotations

import ctypes
from typing import Any

from producers.agent.collector import Partial
from producers.agent.rates import RateTracker
from schemas.inventory import normalise_bus_id

# raw counter -> (metric, scale to the metric's unit)
COUNTER_METRICS: dict[str, tuple[str, float]] = {
    "pcie_replay": ("gpu_pcie_replay_per_s", 1.0),
    "nvlink_tx_kib": ("gpu_nvlink_tx_bps", 1024.0),
    "nvlink_rx_kib": ("gpu_nvlink_rx_bps", 1024.0),
    "nvlink_errors": ("gpu_nvlink_err_per_s", 1.0),
    "ecc_sbe_volatile": ("gpu_ecc_sbe_per_s", 1.0),
}

# nominal dense BF16 tensor TFLOP/s by model name; longest match first
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0), ("B200", 2250.0), ("B100", 1750.0), ("GH200", 989.0),
    ("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("H800", 989.0), ("H20", 148.0),
    ("A100", 312.0), ("A800", 312.0), ("A30", 165.0), ("A10", 125.0), ("L40S", 362.0),
    ("L40", 181.0), ("L4", 121.0), ("V100", 125.0), ("T4", 65.0),
)
NOMINAL_PEAK = 100.0


def peak_for(model: str) -> float | None:
    for key, peak in PEAK_TFLOPS:
        if key in model:
            return peak
    return None


def tensor_tflops(util_pct: float, sm_mhz: float, max_sm_mhz: float | None, peak: float) -> float:
    ratio = min(1.0, sm_mhz / max_sm_mhz) if max_sm_mhz else 1.0
    return max(0.0, util_pct) / 100.0 * ratio * peak


def put_gpu(out: Partial, rates: RateTracker, dev: str, now: float,
            gauges: dict[str, float], counters: dict[str, int],
            max_sm_mhz: float | None, peak: float) -> None:
    """Add one GPU's metrics to ``out`` (rates appear from the second reading on)."""
    for metric, value in gauges.items():
        out.put("gpu", dev, metric, value)
    for name, value in counters.items():
        metric, scale = COUNTER_METRICS[name]
        r = rates.update((dev, name), now, value)
        if r is not None:
            out.put("gpu", dev, metric, r.per_s * scale)
    util, sm = gauges.get("gpu_util_pct"), gauges.get("gpu_sm_clock_mhz")
    if util is not None and sm is not None:
        out.put("gpu", dev, "gpu_tensor_tflops", tensor_tflops(util, sm, max_sm_mhz, peak))


# -- NVML helpers: bus ids, XID lines, field values, handles (nvml.py re-exports them) -----
def kernel_bus(bus_id: str) -> str:
    """NVML ``00000000:3B:00.0`` → the kernel's Xid form ``0000:3b:00``."""
    n = normalise_bus_id(bus_id)
    return n.rsplit(".", 1)[0] if n else bus_id


def handle_key(handle: Any) -> Any:
    """A hashable identity for an NVML device handle (a ctypes pointer, or a test's int)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


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
