"""NVML facts for CBD (pynvml from nvidia-ml-py): one snapshot, every call guarded.

Aegis §6 (CBD) configuration stage and §4.1 CriticalError evidence: driver and CUDA
versions, GPU count, persistence and ECC modes, SM clocks and throttle reasons, pending
row remaps and retired pages, uncorrectable ECC, PCIe generation/width, active NVLinks.
A call this GPU or driver lacks gives ``None`` for that field; other NVML errors are kept
as ``{"error": "..."}`` so the checks can tell "not supported" from "broken".
No library or no driver: ``{"available": false, "reason": ...}``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

_NOT_SUPPORTED = (3, 13)  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND
_GPU_LOST = 15
# HW slowdown, HW thermal slowdown, HW power brake (nvml.h nvmlClocksEventReason*)
HW_SLOWDOWN_MASK = 0x8 | 0x40 | 0x80


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class _Reader:
    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self.lost = False

    def call(self, name: str, *args: Any) -> Any:
        fn: Callable[..., Any] | None = getattr(self.nvml, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as e:
            code = getattr(e, "value", None)
            if code in _NOT_SUPPORTED:
                return None
            if code == _GPU_LOST:
                self.lost = True
            return {"error": f"{name}: {e}"}


def _gpu(r: _Reader, i: int) -> dict[str, Any]:
    n = r.nvml
    h = r.call("nvmlDeviceGetHandleByIndex", i)
    if h is None or isinstance(h, dict):
        return {"index": i, "error": (h or {}).get("error", "no handle")}
    pci = r.call("nvmlDeviceGetPciInfo", h)
    ecc = r.call("nvmlDeviceGetEccMode", h)
    remap = r.call("nvmlDeviceGetRemappedRows", h)
    reasons = r.call("nvmlDeviceGetCurrentClocksEventReasons", h)
    if reasons is None:
        reasons = r.call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
    nvlinks = None
    max_links = int(getattr(n, "NVML_NVLINK_MAX_LINKS", 18))
    states = [r.call("nvmlDeviceGetNvLinkState", h, k) for k in range(max_links)]
    if any(isinstance(s, int) for s in states):
        nvlinks = {"active": sum(1 for s in states if s == 1),
                   "inactive": sum(1 for s in states if s == 0)}
    g: dict[str, Any] = {
        "index": i, "name": _text(r.call("nvmlDeviceGetName", h)),
        "bus": _text(pci.busId).lower() if pci is not None and not isinstance(pci, dict)
        else None,
        "persistence": r.call("nvmlDeviceGetPersistenceMode", h),
        "ecc_current": ecc[0] if isinstance(ecc, list | tuple) else ecc,
        "ecc_pending": ecc[1] if isinstance(ecc, list | tuple) else None,
        "sm_clock_mhz": r.call("nvmlDeviceGetClockInfo", h, n.NVML_CLOCK_SM),
        "sm_max_mhz": r.call("nvmlDeviceGetMaxClockInfo", h, n.NVML_CLOCK_SM),
        "sm_app_mhz": r.call("nvmlDeviceGetApplicationsClock", h, n.NVML_CLOCK_SM),
        "clock_reasons": reasons,
        "temp_c": r.call("nvmlDeviceGetTemperature", h, n.NVML_TEMPERATURE_GPU),
        "ecc_uncorrected_volatile": r.call("nvmlDeviceGetTotalEccErrors", h,
                                           n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                           n.NVML_VOLATILE_ECC),
        "retired_pending": r.call("nvmlDeviceGetRetiredPagesPendingStatus", h),
        "remap": ({"correctable": remap[0], "uncorrectable": remap[1], "pending": remap[2],
                   "failure": remap[3]} if isinstance(remap, list | tuple) else remap),
        "pcie_gen": r.call("nvmlDeviceGetCurrPcieLinkGeneration", h),
        "pcie_gen_max": r.call("nvmlDeviceGetMaxPcieLinkGeneration", h),
        "pcie_width": r.call("nvmlDeviceGetCurrPcieLinkWidth", h),
        "pcie_width_max": r.call("nvmlDeviceGetMaxPcieLinkWidth", h),
        "nvlinks": nvlinks,
    }
    return g


def read_nvml(nvml: ModuleType | None = None) -> dict[str, Any]:
    """Snapshot of every GPU; ``nvml`` is the pynvml module (a fake one in tests)."""
    if nvml is None:
        try:
            import pynvml
        except ImportError as e:
            return {"available": False, "reason": f"pynvml not installed: {e}"}
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as e:  # NVMLError, or OSError from a broken library
        return {"available": False, "reason": f"NVML not available: {e}"}
    try:
        r = _Reader(nvml)
        count = r.call("nvmlDeviceGetCount")
        cuda = r.call("nvmlSystemGetCudaDriverVersion")
        out: dict[str, Any] = {
            "available": True, "driver": _text(r.call("nvmlSystemGetDriverVersion")),
            "cuda": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
            "count": count if isinstance(count, int) else None,
        }
        out["gpus"] = [_gpu(r, i) for i in range(count)] if isinstance(count, int) else []
        out["gpu_lost"] = r.lost
        return out
    finally:
        with contextlib.suppress(Exception):  # shutdown errors change nothing here
            nvml.nvmlShutdown()
