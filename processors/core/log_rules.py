"""The hardware rules behind :func:`processors.core.log_classifier.classify` (GPU driver, DCGM,
PCIe, NICs, the host's CPU and memory), one group per log family; the software ones (PyTorch,
NCCL, Gloo, CUDA) are in :mod:`processors.core.log_rules_software`.

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
    peer: str | None = None  # the other end, where the group reads it itself (Ray's node ip)


# ---- NVIDIA driver (NVRM), XIDs -----------------------------------------------------------
_XID_NVRM = re.compile(
    r"Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\):?\s*(\d{1,4})\b")
_XID_REDACTED = re.compile(r"Xid \(PCI:[^()]{0,40}\):?\s*(\d{1,4})\b")  # bus id edited out: PCI:...
_XID_KV = re.compile(r"\b(?:Xid|XID)[=: ]+(\d{1,4})\b|\bxid (\d{1,4}) detected\b")  # gpud: "xid 119 detected"
_BUS = re.compile(r"\b([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\b")
_GPU_BUS = re.compile(r"GPU (?:at )?(?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)")


def xid(line: str) -> tuple[int, str | None] | None:
    """(XID, bus id or None) of an ``NVRM: Xid (PCI:…): N`` line or an ``Xid=N`` report."""
    if "Xid" not in line and "XID" not in line and "xid " not in line or "SXid" in line:
        return None
    m = _XID_NVRM.search(line)
    if m:
        return int(m.group(2)), m.group(1)
    m = _XID_REDACTED.search(line)
    if m:
        return int(m.group(1)), None
    m = _XID_KV.search(line)
    if m:
        b = _BUS.search(line)
        return int(m.group(1) or m.group(2)), (b.group(1) if b else None)
    return None


def xid_line_severity(line: str) -> str | None:
    """NVLink5 XIDs (144-150) say ``Fatal`` or ``Nonfatal`` themselves; that word decides."""
    if " Nonfatal " in line or "Non-fatal" in line or "Nonfatal," in line:
        return "degraded"
    if " Fatal " in line or " Fatal," in line:
        return "fatal"
    return None


_FM_SXID = re.compile(r"detected NVSwitch (?:non-)?fatal error (\d{1,6})")
_SMI_BUS = re.compile(r"device handle for GPU ?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])")
_SXID = re.compile(r"SXid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\):?\s*(\d{1,6})\b")


def nvrm(line: str) -> Hit | None:
    """NVIDIA driver lines without an XID number, nvidia-smi's lost GPUs, NVSwitch SXids."""
    if "fallen off the bus" in line:
        m = _GPU_BUS.search(line)
        return Hit("critical_gpu", "fatal", "gpu_fallen_off_bus", pci=m.group(1) if m else None)
    if "Unable to determine the device handle for GPU" in line:
        m = _SMI_BUS.search(line, 0, SCAN_CHARS)
        bus = m.group(1) if m else None
        if "GPU is lost" in line:  # nvidia-smi: the driver marked it lost (fallen off the bus)
            return Hit("critical_gpu", "fatal", "gpu_lost", pci=bus)
        # "Unknown Error": a GPU that fell off, or a container that lost its device nodes
        return Hit("critical_gpu", "degraded", "gpu_handle_unavailable", pci=bus)
    if ("Failed to initialize NVML: Unknown Error" in line or "nvml error: unknown error" in line
            or "Failed to initialize NVML: ERROR_UNKNOWN" in line  # go-nvml's spelling
            or "nvmlDeviceGetHandleByIndex" in line and "Unknown Error" in line):
        # NVML cannot reach a GPU: one that fell off, or a container that lost its device nodes
        # (nvidia-container-cli's detection error, NVIDIA/nvidia-docker#1671)
        return Hit("critical_gpu", "degraded", "gpu_handle_unavailable")
    if "GPU is lost" in line or "ERROR_GPU_IS_LOST" in line:  # NVML's verdict as other clients
        # print it (kubelet, plugins, gpud's go-nvml spelling; the agent's notice names the bus)
        m = _BUS.search(line, 0, SCAN_CHARS)
        return Hit("critical_gpu", "fatal", "gpu_lost", pci=m.group(1) if m else None)
    if "SXid" in line:  # NVSwitch errors; the line says Fatal / Non-fatal itself
        m = _SXID.search(line, 0, SCAN_CHARS)
        if m:
            sev = xid_line_severity(line) or "degraded"
            return Hit("nvlink", sev, f"sxid_{m.group(2)}", pci=m.group(1))
    if "detected NVSwitch" in line and "error" in line:  # the fabric manager's own SXid report
        m = _FM_SXID.search(line, 0, SCAN_CHARS)
        sev = "degraded" if "non-fatal" in line else "fatal" if "fatal error" in line else "degraded"
        return Hit("nvlink", sev, f"sxid_{m.group(1)}" if m else "nvswitch_error")
    if "NVRM" not in line:
        return None
    if "API mismatch" in line:  # the kernel's side of NVML's "Driver/library version mismatch"
        return Hit("config", "fatal", "nvml_driver_mismatch")
    if ("RmInitAdapter failed" in line or "rm_init_adapter failed" in line  # as XID 143
            or "bailing out of RmInitAdapter" in line or "Cannot attach gpu" in line
            or "Cannot initialize GSP firmware" in line):
        m = _GPU_BUS.search(line)
        return Hit("critical_gpu", "fatal", "nvrm_init_failed", pci=m.group(1) if m else None)
    if "GSP" in line and ("imeout" in line or "timedout" in line or "needs to be reset" in line) \
            or "rpcRecvPoll timedout" in line:  # GSP stopped answering (XID 119 when logged)
        m = _GPU_BUS.search(line)
        sev = "fatal" if "marked for reset" in line else "degraded"
        return Hit("critical_gpu", sev, "nvrm_gsp_timeout", pci=m.group(1) if m else None)
    if "NV_ERR_RESET_REQUIRED" in line or "Reset required" in line:  # the driver refuses the
        m = _GPU_BUS.search(line)  # GPU's work until it is reset: every restart fails on it
        return Hit("critical_gpu", "fatal", "nvrm_reset_required", pci=m.group(1) if m else None)
    if "failed to wait for GFW_BOOT" in line:  # the GPU's firmware did not finish booting
        m = _GPU_BUS.search(line)
        return Hit("critical_gpu", "degraded", "nvrm_gfw_boot_timeout", pci=m.group(1) if m else None)
    if "Memory Subsystem Error" in line:
        return Hit("critical_gpu", "degraded", "nvrm_mem_subsystem_error")
    if "RC watchdog" in line and "locked" in line:  # a channel stopped making progress (XID 8
        return Hit("critical_gpu", "degraded", "nvrm_rc_watchdog")  # when it is logged)
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
    ("IMEX", "config", "degraded"),  # the NVLink-domain daemon is down: software, not the GPU
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


_USB_HC = re.compile(r"\b(?:xhci_hcd|[eou]hci[-_](?:pci|hcd)|uhci_hcd) [0-9a-f]{4}:")  # no reason to take a host out


_DPC_STATUS = re.compile(r"containment event, status:0x([0-9a-fA-F]{1,4})")


def first_bus(line: str) -> str | None:
    m = _FROM_BUS.search(line, 0, SCAN_CHARS) or _BUS.search(line, 0, SCAN_CHARS)
    return m.group(1) if m else None


def pcie(line: str) -> Hit | None:
    """PCIe AER reports, link-width/speed degradation (Aegis: lane degradation is critical)."""
    if "PCIe" in line and "PCIe bandwidth" in line and "limited by" in line:
        m = _LIMITED.search(line, 0, SCAN_CHARS)
        if m and int(m.group(1)) < int(m.group(2)):
            return Hit("pcie", "fatal", "pcie_link_width_degraded", pci=first_bus(line))
        return Hit("pcie", "degraded", "pcie_link_speed_degraded", pci=first_bus(line))
    if "graded" in line:  # lspci LnkSta "(downgraded)", "link width degraded"
        low = line.lower()
        if _WIDTH_DOWN.search(low, 0, SCAN_CHARS):
            return Hit("pcie", "fatal", "pcie_link_width_degraded", pci=first_bus(line))
        if _SPEED_DOWN.search(low, 0, SCAN_CHARS):
            return Hit("pcie", "degraded", "pcie_link_speed_degraded", pci=first_bus(line))
    if "pciehp" in line:  # hotplug: the card behind the slot is gone, or back
        if "Link Down" in line or "Card not present" in line or "Surprise Removal" in line:
            return Hit("pcie", "fatal", "pcie_slot_down", pci=first_bus(line))
        if "Link Up" in line or "Card present" in line:
            return Hit("pcie", "info", "pcie_slot_up", pci=first_bus(line))
    if "DPC: " in line:  # Downstream Port Containment: the port cut its link off
        m = _DPC_STATUS.search(line, 0, SCAN_CHARS)  # bits 2:1 of the status: the trigger
        fatal = "ERR_FATAL" in line or (m is not None and int(m.group(1), 16) >> 1 & 3 == 2)
        if fatal or "containment event" in line or "detected" in line:
            return Hit("pcie", "fatal" if fatal else "degraded", "pcie_dpc_containment",
                       pci=first_bus(line))
    if "PCI SERR" in line or "PCI PERR" in line:  # a BMC's SEL: a bus error interrupt
        return Hit("pcie", "degraded", "pcie_bus_error", pci=first_bus(line))
    if "Completion-Wait loop timed out" in line or "IOTLB_INV_TIMEOUT" in line:
        return Hit("pcie", "degraded", "iommu_timeout", pci=first_bus(line))  # AMD-Vi stopped answering
    if "IO_PAGE_FAULT" in line or ("DMAR" in line and "fault addr" in line):
        # a device's DMA refused by the IOMMU (AMD-Vi, Intel VT-d): integrated graphics,
        # Wi-Fi and NVMe log these at boot on healthy hosts, so info; the classifier makes it
        # degraded when the inventory says the device is one of the host's GPUs
        return Hit("pcie", "info", "iommu_dma_fault", pci=first_bus(line))
    if "AER" not in line and "pcieport" not in line and not ("PCIe" in line and "Bus Error" in line):
        return None
    # a USB host controller's error is no reason to take the host out of training
    usb = _USB_HC.search(line, 0, SCAN_CHARS) is not None
    if "can't recover" in line or "recovery failed" in line or "Recovery failed" in line:
        return Hit("pcie", "degraded" if usb else "fatal", "pcie_aer_unrecovered",
                   pci=first_bus(line))
    if "Uncorrect" in line:
        sev = "degraded" if usb or "Non-Fatal" in line or "NonFatal" in line else "fatal"
        return Hit("pcie", sev, "pcie_aer_uncorrected", pci=first_bus(line))
    if "Correct" in line:
        return Hit("pcie", "info", "pcie_aer_corrected", pci=first_bus(line))
    m = _AER_DETAIL.search(line[-200:])
    if m:
        name = m.group(1)
        if any(k in name for k in _AER_FATAL):
            return Hit("pcie", "fatal", "pcie_aer_uncorrected", pci=first_bus(line))
        if any(k in name for k in _AER_NONFATAL):
            return Hit("pcie", "degraded", "pcie_aer_uncorrected", pci=first_bus(line))
        return Hit("pcie", "info", "pcie_aer_corrected", pci=first_bus(line))
    return None


# ---- NICs (mlx5, netdev link state) -------------------------------------------------------
_NIC_DEV = re.compile(r"\b(mlx5_\d+)\b|infiniband (\S+?):|\b([A-Za-z][\w.-]{1,15}): (?:NIC )?[Ll]ink ")
_BOND_SLAVE = re.compile(r"\(slave ([\w.-]{1,15})\)|for interface ([\w.-]{1,15})")  # not bond0
_TX_DEV = (re.compile(r"NETDEV WATCHDOG: ([A-Za-z][\w.-]{0,15}) \("),
           re.compile(r"\b([A-Za-z][\w.-]{0,15}): (?:NETDEV WATCHDOG|TX timeout|Found a Tx|transmit timeout)"))
_LINK_DOWN = ("Link down", "link down", "Link is Down", "Link is down", "Link DOWN", "PORT_DOWN",
              "state changed to DOWN", "changed state to DOWN", "link becomes not ready",
              "link status definitely down")
_LINK_UP = ("Link up", "link up", "Link is Up", "Link is up", "Link UP", "Link ACTIVE",
            "PORT_ACTIVE", "link becomes ready", "link status definitely up")
# creating or connecting a verbs object failed outside NCCL (UCX, perftest, NVSHMEM, Mooncake):
# the host's RDMA setup, as NCCL's "ibv_create_cq failed" (log_rules_software._CONFIG_RULES)
_VERBS_SETUP = ("ibv_modify_qp", "ibv_create_qp", "ibv_create_cq", "mlx5dv_create_cq",
                "mlx5dv_create_qp", "mlx5dv_devx_obj_create", "modify QP to ")
_PERFTEST_STATUS = re.compile(r"Failed status (\d{1,3}): wr_id")  # perftest: ibv_wc_status
_MLX5_HEALTH_SYND = re.compile(r"(?<!_)synd 0x[0-9A-Fa-f]{1,8}: ")  # print_health_info's syndrome
_RETRY_EXCEEDED = ("retry count exceeded", "retry counter exceeded", "RETRY_EXC_ERR",
                   "Retry count exceeded")


def nic_device(line: str) -> str | None:
    """The NIC port or netdev a line names: a bond's slave, mlx5_0, an infiniband device."""
    m = _BOND_SLAVE.search(line, 0, SCAN_CHARS) or _NIC_DEV.search(line, 0, SCAN_CHARS)
    return next((g for g in m.groups() if g), None) if m else None


def _tx_dev(line: str) -> str | None:
    for rx in _TX_DEV:
        m = rx.search(line, 0, SCAN_CHARS)
        if m:
            return m.group(1)
    return None


def nic(line: str) -> Hit | None:
    """Host NIC events: mlx5 firmware health, module/cable, CQE errors, link state, transmit
    hangs; and RDMA transport retries exhausted outside NCCL (UCX, MPI: the peer or the path
    stopped answering, as NCCL's status=12)."""
    if ("etry coun" in line or "RETRY_EXC" in line) and "NCCL" not in line and \
            any(k in line for k in _RETRY_EXCEEDED):
        return Hit("distributed_symptom", "fatal", "ib_retry_exceeded", device=nic_device(line))
    if "ailed" in line and "NCCL" not in line and any(k in line for k in _VERBS_SETUP) and (
            "failed" in line or "Failed to modify QP" in line):
        return Hit("config", "fatal", "nccl_ib_qp_setup", device=nic_device(line))
    if "Failed status" in line:  # perftest's failed completion; 12 = IBV_WC_RETRY_EXC_ERR
        m = _PERFTEST_STATUS.search(line, 0, SCAN_CHARS)
        if m:
            rule = "ib_retry_exceeded" if m.group(1) == "12" else "ib_completion_error"
            return Hit("distributed_symptom", "fatal", rule)
    if ("ompletion with err" in line or "(synd 0x" in line) and "NCCL" not in line and (
            "ompletion with error" in line and ("UCX" in line or "_iface.c" in line or "mlx5:" in line)
            or "ib_mlx5_log.c" in line and "(synd 0x" in line):
        # a work request failed on the wire, outside NCCL: UCX's "Send completion with error",
        # its ib_mlx5_log "Local protection on mlx5_0:1/IB (synd …)", libmlx5's own dump
        return Hit("distributed_symptom", "fatal", "ib_completion_error", device=nic_device(line))
    if ("imeout" in line or "NETDEV" in line or "tx completions" in line) and (
            "NETDEV WATCHDOG" in line or "TX timeout" in line or "lost tx completions" in line
            or "Keep alive watchdog timeout" in line or "transmit timeout: latency" in line
            or "tx_timeout recovery level" in line) or "Found a Tx that wasn't completed" in line:
        # the NIC stopped transmitting (ENA: "Found a Tx that wasn't completed on time", IPoIB:
        # "ib1: transmit timeout: latency 1240 msecs", i40e: "tx_timeout recovery level 2")
        return Hit("nic_or_link", "degraded", "nic_tx_timeout", pci=first_bus(line),
                   device=_tx_dev(line) or nic_device(line))
    mlx = ("mlx5" in line or "MLX5" in line) and "NCCL" not in line
    if mlx:
        if "ACCESS_REG" in line:  # monitoring reads on restricted PFs: known flood, harmless
            return Hit("other", "info", "mlx5_access_reg_noise")
        if "mlx5_cmd_check" in line or "mlx5_cmd_out_err" in line:  # a refused driver command
            return Hit("other", "info", "mlx5_cmd_failed")
        if "failed" in line and ("load_one" in line or "probe of" in line):  # Aegis: NIC driver error
            return Hit("nic_or_link", "fatal", "nic_driver_error", pci=first_bus(line))
        if ("health compromised" in line or "internal error" in line or "recovery flow aborted"
                in line or "FW fatal" in line or "fw_fatal" in line
                or "unrecoverable hardware error" in line  # print_health_info's "synd 0x…"
                or "Will cause a leak of a command resource" in line  # FW stopped answering
                or "No done completion" in line  # the same command timeout, its first line
                or "Fatal error" in line and "detected" in line  # poll_health
                or "mlx5_enter_error_state:" in line  # the driver took the device down (not a trace)
                or "print_health_info" in line and _MLX5_HEALTH_SYND.search(line, 0, SCAN_CHARS)):
            return Hit("nic_or_link", "fatal", "nic_fw_fatal", pci=first_bus(line), device=nic_device(line))
        if "High temperature" in line and "temp_warn" in line:  # the HCA's sensors, before its shutdown
            return Hit("nic_or_link", "degraded", "nic_high_temperature", pci=first_bus(line),
                       device=nic_device(line))
        if "Port module event" in line:
            # an unplugged cable: its link-down line follows (an unused port logs it at boot)
            sev = "fatal" if "error" in line.lower() else "degraded" if "unplugged" in line else \
                "info" if "plugged" in line else "degraded"
            return Hit("nic_or_link", sev, "nic_module_event", pci=first_bus(line), device=nic_device(line))
        if "insufficient power" in line:
            return Hit("nic_or_link", "degraded", "nic_insufficient_power", pci=first_bus(line))
        if ("cqe" in line or "CQE" in line or "CQ error" in line or "cq_error" in line
                or "syndrome" in line):
            return Hit("nic_or_link", "degraded", "nic_cqe_error", pci=first_bus(line), device=nic_device(line))
    hit = _other_nic(line)
    if hit is not None:
        return hit
    if "ink" in line or "DOWN" in line:
        if "NCCL" in line:
            return None
        if "SATA link" in line:  # a disk port (an empty one logs this at every boot)
            return Hit("other", "info", "sata_link")
        if ".pcie:" in line or "-pcie " in line:  # a SoC PCIe controller (brcm-pcie fd500000.pcie:
            return Hit("pcie", "info", "pcie_controller_link")  # link down): an empty slot at boot
        for s in _LINK_DOWN:
            if s in line:
                return Hit("nic_or_link", "degraded", "nic_link_down", pci=first_bus(line), device=nic_device(line))
        for s in _LINK_UP:
            if s in line:
                return Hit("nic_or_link", "info", "nic_link_up", pci=first_bus(line), device=nic_device(line))
    return None


def _other_nic(line: str) -> Hit | None:
    """Other vendors' NIC firmware and admin failures: Broadcom bnxt_en's firmware crash (its
    planned ``Non-fatal firmware reset event`` is not one), Intel ixgbe's firmware error, the
    AWS EFA driver's refused admin commands (``Failed to process command ALLOC_PD``)."""
    if "irmware" in line:
        if "Fatal firmware reset event" in line and "Non-fatal" not in line:
            return Hit("nic_or_link", "fatal", "nic_fw_fatal", pci=first_bus(line))
        if "Abandoning msg" in line and "due to firmware status" in line:  # bnxt_en: FW not answering
            return Hit("nic_or_link", "degraded", "nic_fw_error", pci=first_bus(line))
        if "firmware error detected" in line and "FWSM" in line:  # ixgbe
            return Hit("nic_or_link", "degraded", "nic_fw_error", pci=first_bus(line))
    if "efa" in line and ("Failed to process command" in line or "Failed to allocate pd" in line):
        return Hit("nic_or_link", "degraded", "efa_admin_cmd_failed", pci=first_bus(line),
                   device=nic_device(line))
    return None


DEVICES = (nvrm, dcgm, pcie, nic)  # the host itself: log_rules_host; software: log_rules_software
