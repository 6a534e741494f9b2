"""The rules behind :func:`processors.core.log_classifier.classify`, one group per log family.

Each group is a function ``line -> Hit | None``. It returns None when the line is not one of
its own, so a later group may still claim it (an ``NCCL INFO NET/IB : Using mlx5_0`` line names
a NIC but belongs to NCCL). Every group starts with plain substring tests, which cost tens of
nanoseconds, and only then runs a regex; the patterns are linear (no nested repeats) and run
on at most the first :data:`SCAN_CHARS` characters.

Sources of the formats: the real lines in ``tests/data/log_lines.jsonl`` (each with its public
URL) and NVIDIA's XID catalogue (``xid_policy.toml``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

SCAN_CHARS = 4096


class Hit(NamedTuple):
    category: str
    severity: str
    rule: str
    xid: int | None = None
    pci: str | None = None  # raw bus id as written in the line
    device: str | None = None  # NIC port / netdev (mlx5_0, ib0, eth5)


# ---- NVIDIA driver (NVRM), XIDs -----------------------------------------------------------
_XID_NVRM = re.compile(
    r"Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\):?\s*(\d{1,4})\b")
_XID_KV = re.compile(r"\b(?:Xid|XID)[=: ]+(\d{1,4})\b")
_BUS = re.compile(r"\b([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\b")
_GPU_BUS = re.compile(r"GPU (?:at )?(?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)")


def xid(line: str) -> tuple[int, str | None] | None:
    """(XID, bus id or None) of an ``NVRM: Xid (PCI:…): N`` line or an ``Xid=N`` report."""
    if "Xid" not in line and "XID" not in line:
        return None
    m = _XID_NVRM.search(line)
    if m:
        return int(m.group(2)), m.group(1)
    m = _XID_KV.search(line)
    if m:
        b = _BUS.search(line)
        return int(m.group(1)), (b.group(1) if b else None)
    return None


def xid_line_severity(line: str) -> str | None:
    """NVLink5 XIDs (144-150) say ``Fatal`` or ``Nonfatal`` themselves; that word decides."""
    if " Nonfatal " in line or "Non-fatal" in line:
        return "degraded"
    if " Fatal " in line:
        return "fatal"
    return None


def nvrm(line: str) -> Hit | None:
    """NVIDIA driver lines without an XID number."""
    if "fallen off the bus" in line:
        m = _GPU_BUS.search(line)
        return Hit("critical_gpu", "fatal", "gpu_fallen_off_bus", pci=m.group(1) if m else None)
    if "NVRM" not in line:
        return None
    low = line.lower()
    if "nvlink" in low and ("fail" in low or "error" in low or "fatal" in low):
        sev = "fatal" if "fatal" in low else "degraded"
        return Hit("nvlink", sev, "nvrm_nvlink_error")
    if "uncorrectable" in low and "ecc" in low:
        return Hit("critical_gpu", "fatal", "nvrm_uncorrectable_ecc")
    return Hit("other", "info", "nvrm_info")


# ---- DCGM ---------------------------------------------------------------------------------
_DCGM_FR = re.compile(r"DCGM_FR_([A-Z0-9_]+)")
_DCGM_CODES: tuple[tuple[str, str, str], ...] = (  # code fragment -> category, severity
    ("FALLEN_OFF_BUS", "critical_gpu", "fatal"), ("DBE", "critical_gpu", "fatal"),
    ("UNCORRECTABLE", "critical_gpu", "fatal"), ("ROW_REMAP_FAILURE", "critical_gpu", "fatal"),
    ("UNCONTAINED", "critical_gpu", "fatal"), ("SBE", "benign_gpu", "info"),
    ("PENDING", "benign_gpu", "degraded"), ("RETIRED", "benign_gpu", "degraded"),
    ("NVLINK", "nvlink", "degraded"), ("NVSWITCH", "nvlink", "degraded"),
    ("PCI", "pcie", "degraded"), ("CLOCK", "benign_gpu", "info"), ("POWER", "benign_gpu", "info"),
    ("THERMAL", "critical_gpu", "degraded"), ("TEMP", "critical_gpu", "degraded"),
)


def dcgm(line: str) -> Hit | None:
    """DCGM health events (``DCGM_FR_*`` codes) and ``dcgmi diag`` result rows."""
    if "DCGM_FR_" in line:
        m = _DCGM_FR.search(line, 0, SCAN_CHARS)
        code = m.group(1) if m else ""
        for frag, cat, sev in _DCGM_CODES:
            if frag in code:
                return Hit(cat, sev, "dcgm_" + code.lower())
        return Hit("critical_gpu", "degraded", "dcgm_" + (code.lower() or "event"))
    if "Fail" in line and line.lstrip().startswith("|"):
        name = line.lstrip().split("|", 2)[1].lower()
        cat = ("pcie" if "pcie" in name else "nvlink" if "nvlink" in name else "critical_gpu")
        return Hit(cat, "degraded", "dcgm_diag_fail")
    return None


# ---- PCIe (AER, link training) ------------------------------------------------------------
_LIMITED = re.compile(r"limited by [\d.]+ GT/s PCIe x(\d+) link.{0,80}?capable of [\d.]+ Gb/s with "
                      r"[\d.]+ GT/s PCIe x(\d+) link")
_AER_DETAIL = re.compile(r"\[\s?\d{1,2}\]\s+([A-Za-z][A-Za-z /-]{1,40}?)\s*(?:\(First\))?\s*$")
_AER_FATAL = ("Surprise Down", "SDES", "Malformed TLP", "MalfTLP", "Receiver Overflow", "RxOF",
              "Flow Control Protocol", "FCP", "Data Link Protocol", "DLP", "Uncorrectable Internal")
_AER_NONFATAL = ("Poisoned TLP", "PoisonTLP", "Completion Timeout", "CmpltTO", "Completer Abort",
                 "CmpltAbrt", "Unsupported Request", "UnsupReq", "ECRC", "ACS Violation",
                 "Unexpected Completion", "UnxCmplt")
_WIDTH_DOWN = re.compile(r"width:? x?\d+ \((?:downgraded|degraded)\)"
                         r"|width (?:is |was )?(?:degraded|downgraded)|(?:degraded|downgraded) (?:link )?width")
_SPEED_DOWN = re.compile(r"speed:? [\d.]+ ?gt/s \((?:downgraded|degraded)\)"
                         r"|speed (?:is |was )?(?:degraded|downgraded)")
_FROM_BUS = re.compile(r"received(?: from|:)\s+([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])")


def _first_bus(line: str) -> str | None:
    m = _FROM_BUS.search(line, 0, SCAN_CHARS) or _BUS.search(line, 0, SCAN_CHARS)
    return m.group(1) if m else None


def pcie(line: str) -> Hit | None:
    """PCIe AER reports, link-width/speed degradation (Aegis: lane degradation is critical)."""
    if "PCIe" in line and "PCIe bandwidth" in line and "limited by" in line:
        m = _LIMITED.search(line, 0, SCAN_CHARS)
        if m and int(m.group(1)) < int(m.group(2)):
            return Hit("pcie", "fatal", "pcie_link_width_degraded", pci=_first_bus(line))
        return Hit("pcie", "degraded", "pcie_link_speed_degraded", pci=_first_bus(line))
    if "graded" in line:  # lspci LnkSta "(downgraded)", "link width degraded"
        low = line.lower()
        if _WIDTH_DOWN.search(low, 0, SCAN_CHARS):
            return Hit("pcie", "fatal", "pcie_link_width_degraded", pci=_first_bus(line))
        if _SPEED_DOWN.search(low, 0, SCAN_CHARS):
            return Hit("pcie", "degraded", "pcie_link_speed_degraded", pci=_first_bus(line))
    if "AER" not in line and "pcieport" not in line and not ("PCIe" in line and "Bus Error" in line):
        return None
    if "Uncorrect" in line:
        sev = "degraded" if "Non-Fatal" in line or "NonFatal" in line else "fatal"
        return Hit("pcie", sev, "pcie_aer_uncorrected", pci=_first_bus(line))
    if "Correct" in line:
        return Hit("pcie", "info", "pcie_aer_corrected", pci=_first_bus(line))
    m = _AER_DETAIL.search(line[-200:])
    if m:
        name = m.group(1)
        if any(k in name for k in _AER_FATAL):
            return Hit("pcie", "fatal", "pcie_aer_uncorrected", pci=_first_bus(line))
        if any(k in name for k in _AER_NONFATAL):
            return Hit("pcie", "degraded", "pcie_aer_uncorrected", pci=_first_bus(line))
        return Hit("pcie", "info", "pcie_aer_corrected", pci=_first_bus(line))
    return None


# ---- NICs (mlx5, netdev link state) -------------------------------------------------------
_NIC_DEV = re.compile(r"\b(mlx5_\d+)\b|infiniband (\S+?):|\b([A-Za-z][\w.-]{1,15}): (?:NIC )?[Ll]ink ")
_LINK_DOWN = ("Link down", "link down", "Link is Down", "Link is down", "PORT_DOWN",
              "state changed to DOWN", "changed state to DOWN", "link becomes not ready")
_LINK_UP = ("Link up", "link up", "Link is Up", "Link is up", "PORT_ACTIVE", "link becomes ready")


def _nic_dev(line: str) -> str | None:
    m = _NIC_DEV.search(line, 0, SCAN_CHARS)
    return next((g for g in m.groups() if g), None) if m else None


def nic(line: str) -> Hit | None:
    """Host NIC events: mlx5 firmware health, module/cable, CQE errors, link state."""
    mlx = ("mlx5" in line or "MLX5" in line) and "NCCL" not in line
    if mlx:
        if "ACCESS_REG" in line:  # monitoring reads on restricted PFs: known flood, harmless
            return Hit("other", "info", "mlx5_access_reg_noise")
        if ("health compromised" in line or "internal error" in line or "recovery flow aborted"
                in line or "FW fatal" in line or "fw_fatal" in line):
            return Hit("nic_or_link", "fatal", "nic_fw_fatal", pci=_first_bus(line), device=_nic_dev(line))
        if "Port module event" in line:
            sev = "fatal" if "error" in line.lower() or "unplugged" in line else "degraded"
            return Hit("nic_or_link", sev, "nic_module_event", pci=_first_bus(line), device=_nic_dev(line))
        if "insufficient power" in line:
            return Hit("nic_or_link", "degraded", "nic_insufficient_power", pci=_first_bus(line))
        if ("cqe" in line or "CQE" in line or "CQ error" in line or "cq_error" in line
                or "syndrome" in line):
            return Hit("nic_or_link", "degraded", "nic_cqe_error", pci=_first_bus(line), device=_nic_dev(line))
    if "ink" in line or "DOWN" in line:
        if "NCCL" in line:
            return None
        for s in _LINK_DOWN:
            if s in line:
                return Hit("nic_or_link", "degraded", "nic_link_down", pci=_first_bus(line), device=_nic_dev(line))
        for s in _LINK_UP:
            if s in line:
                return Hit("nic_or_link", "info", "nic_link_up", pci=_first_bus(line), device=_nic_dev(line))
    return None


# ---- PyTorch ProcessGroupNCCL, NCCL, sockets -----------------------------------------------
def torch_watchdog(line: str) -> Hit | None:
    if "atchdog" not in line and "NCCL" not in line:
        return None
    if "Watchdog caught collective operation timeout" in line:
        return Hit("distributed_symptom", "fatal", "torch_watchdog_timeout")
    if "detected by watchdog" in line or "communicator was aborted" in line:
        return Hit("distributed_symptom", "fatal", "torch_watchdog_exception")
    if "operations have failed or timed out" in line:
        return Hit("distributed_symptom", "fatal", "torch_watchdog_exception")
    return None


_CONFIG_RULES: tuple[tuple[tuple[str, ...], str, str], ...] = (  # any of -> severity, rule
    (("invalid usage", "ncclInvalidUsage", "ncclInvalidArgument"), "fatal", "nccl_invalid_usage"),
    (("Mismatched collective", "collective mismatch"), "fatal", "nccl_collective_mismatch"),
    (("version mismatch", "Mismatched NCCL version", "bytes instead of", "Message truncated",
      "wrong type"), "fatal", "nccl_version_mismatch"),
    (("neither AF_INET", "no socket interface found", "No socket interface found"), "fatal",
     "nccl_socket_config"),
    (("ibv_modify_qp failed",), "fatal", "nccl_ib_qp_setup"),
    (("Unable to open device", "ibv_open_device failed", "could not open"), "degraded",
     "nccl_ib_device_unavailable"),
    (("No device found",), "info", "nccl_ib_no_device"),
)
_DIST_RULES: tuple[tuple[tuple[str, ...], str, str, str], ...] = (  # any of -> cat, sev, rule
    (("unhandled cuda error", "ncclUnhandledCudaError", "Cuda failure"), "cuda_app_error", "fatal",
     "nccl_cuda_error"),
    (("Got completion", "completion error"), "distributed_symptom", "fatal", "nccl_ib_completion_error"),
    (("Connection reset by peer",), "distributed_symptom", "fatal", "nccl_connection_reset"),
    (("closed by remote peer",), "distributed_symptom", "fatal", "nccl_connection_closed"),
    (("remote process exited", "ncclRemoteError"), "distributed_symptom", "fatal", "nccl_remote_error"),
    (("Broken pipe",), "distributed_symptom", "fatal", "nccl_broken_pipe"),
    (("unhandled system error", "ncclSystemError"), "distributed_symptom", "fatal",
     "nccl_system_error"),
    (("internal error", "ncclInternalError"), "distributed_symptom", "fatal", "nccl_internal_error"),
    (("socketStartConnect", "Connection refused", "connection refused", "Connect to "),
     "distributed_symptom", "fatal", "nccl_connect_failed"),
    (("recv failed", "send failed", "Call to recv", "Call to send"), "distributed_symptom", "fatal",
     "nccl_socket_io_failed"),
    (("Failed to execute operation",), "distributed_symptom", "fatal", "nccl_proxy_failed"),
    (("timeout", "Timeout", "timed out"), "distributed_symptom", "fatal", "nccl_timeout"),
)


def nccl(line: str) -> Hit | None:
    """NCCL WARN lines, the NCCL errors PyTorch raises, and NCCL's socket layer."""
    is_nccl = ("NCCL" in line or "nccl" in line or "NET/IB" in line or "Message truncated" in line)
    if not is_nccl and "socket" not in line:
        return None
    if "NCCL INFO" in line:
        if "No device found" in line:
            return Hit("config", "info", "nccl_ib_no_device")
        return Hit("other", "info", "nccl_info")
    for keys, sev, rule in _CONFIG_RULES:
        for k in keys:
            if k in line:
                return Hit("config", sev, rule)
    if "NCCL_" in line and ("nvalid" in line or "nknown" in line) and "TORCH_NCCL" not in line:
        return Hit("config", "degraded", "nccl_env_invalid")
    for keys, cat, sev, rule in _DIST_RULES:
        for k in keys:
            if k in line:
                if not is_nccl and rule not in ("nccl_connection_reset", "nccl_connection_closed",
                                                "nccl_socket_io_failed", "nccl_broken_pipe"):
                    break
                return Hit(cat, sev, rule)
    if is_nccl and ("NCCL WARN" in line or "NCCL error" in line):
        return Hit("distributed_symptom", "degraded", "nccl_warn")
    return None


# ---- CUDA runtime errors seen by the application ------------------------------------------
def cuda(line: str) -> Hit | None:
    if "CU" not in line and "cuda" not in line:  # CUDA, CUBLAS, CUDNN
        return None
    if "uncorrectable ECC error" in line:
        return Hit("critical_gpu", "fatal", "cuda_ecc_uncorrectable")
    if "out of memory" in line or "OutOfMemoryError" in line:
        return Hit("cuda_app_error", "fatal", "cuda_oom")
    if "illegal memory access" in line or "illegal address" in line:
        return Hit("cuda_app_error", "fatal", "cuda_illegal_access")
    if "device-side assert" in line:
        return Hit("cuda_app_error", "fatal", "cuda_device_assert")
    if "CUDA-capable device" in line:
        return Hit("cuda_app_error", "fatal", "cuda_no_device")
    if ("CUDA error" in line or "CUDA_ERROR_" in line or "cudaError" in line
            or "CUBLAS_STATUS_" in line and "SUCCESS" not in line
            or "CUDNN_STATUS_" in line and "SUCCESS" not in line):
        return Hit("cuda_app_error", "fatal", "cuda_error")
    return None


GROUPS = (nvrm, dcgm, pcie, nic, torch_watchdog, nccl, cuda)
NCCL_FIRST = (torch_watchdog, nccl, cuda, nvrm, dcgm, pcie, nic)  # same rules, NCCL lines first
