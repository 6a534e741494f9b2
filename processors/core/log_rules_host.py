"""The host's own rules behind :func:`processors.core.log_classifier.classify`: EDAC memory,
machine checks, CPU lockups, hung tasks, thermal, power, panics, storage and the OOM killer
(Aegis: CPU 13.7 %, host memory 9.1 % of failures). The device groups (GPU driver, DCGM,
PCIe, NICs) are in :mod:`processors.core.log_rules`, the conventions there too.
"""

from __future__ import annotations

import re

from processors.core.log_rules import DEVICES, SCAN_CHARS, Hit, first_bus

_PROBE_DEV = re.compile(r"dev (?:fd|sr|loop)\d")
_STORAGE = ("I/O error, dev ", "critical medium error", "EXT4-fs error", "XFS (",  # with "rror"
            "EXT4-fs warning", "I/O error to superblock", "I/O Error (sct", "LustreError",
            "Write error at byte offset", "failed due to network error", "Buffer I/O error on dev",
            "JBD2: Error", "JBD2: I/O error", "I/O error while writing superblock",
            "Device offlined - not ready after error recovery")
_STORAGE_BENIGN = ("Admin Cmd(",  # nvme-cli's unsupported identify, no data I/O
                   "target_handle_connect", "clients in recovery")  # a Lustre server recovering
_STORAGE_STALL = ("QID", "controller is down", "Aborting journal", "Timed out tx for",
                  "was lost; in progress", "Request sent has timed out",  # NVMe timeouts, jbd2, LNet / Lustre client
                  "Removing after probe failure", "Device not ready; aborting")  # an NVMe drive gone
_STORAGE_GONE = re.compile(r"detected capacity change from \d+ to 0\b")
# a BMC's SEL threshold event (ipmitool, Supermicro): a fan, temperature or voltage past its limit
_SEL_THRESHOLD = re.compile(r"(?:Upper|Lower) (?:Critical|Non-[Rr]ecoverable)\s*-?\s*[Gg]oing "
                            r"(?:[Hh]igh|[Ll]ow)\s*[-|]\s*Assert")
_MCE_POLLED = re.compile(r"CPU \d+: Machine Check: \d+ Bank \d+: ")  # found by polling / at boot
_MCELOG_STATUS = re.compile(r"^\s*STATUS ([0-9a-fA-F]{16}) MCGSTATUS ")
_MCE_FATAL = ("event severity: fatal", "Processor context corrupt", "Fatal machine check", "Uncorrected error",
              "UC error", "Kernel panic - not syncing: Fatal")


def host(line: str) -> Hit | None:
    """Kernel reports of the host itself: EDAC memory errors, machine checks, CPU lockups,
    hung tasks, thermal, power, panics, storage; and the OOM killer, which ends the job's
    process (an application error). Gated on a few substrings: most lines pass none."""
    if "rror" in line:  # EDAC, [Hardware Error], I/O / medium / EXT4-fs / XFS errors
        if "EDAC" in line:
            if " UE " in line or "Uncorrected" in line or "uncorrectable" in line:
                return Hit("host_hw", "fatal", "host_memory_uncorrectable")
            if " CE " in line or "Corrected" in line or "correctable" in line:
                return Hit("host_hw", "info", "host_memory_corrected")
        elif "Hardware Error" in line:
            return _mce(line)
        elif any(k in line for k in _STORAGE):  # checkpoints and data loading stall or fail
            if _PROBE_DEV.search(line, 0, SCAN_CHARS):  # an empty floppy / CD / loop device
                return Hit("other", "info", "host_storage_probe")
            if any(k in line for k in _STORAGE_BENIGN):
                return Hit("other", "info", "host_storage_benign")
            return Hit("host_hw", "degraded", "host_storage_error")
    if "achine check" in line or "achine Check" in line:
        if ("Uncorrectable Machine Check" in line or "Uncorrectable machine check" in line
                or "Oops: Machine check" in line):
            return Hit("host_hw", "fatal", "host_mce_fatal")  # a BMC's SEL, powerpc's oops
        if _MCE_CPU.search(line, 0, SCAN_CHARS):
            return _mce_status(line)
        if "events logged" in line or any(k in line for k in _MCE_FATAL):
            return _mce(line)
        return Hit("other", "info", "host_mce_banner")  # "machine check architecture supported"
    if "Processor context corrupt" in line or "synchronous external abort" in line \
            and "Internal error" in line:  # mcelog's decoding; arm64's kernel oops on a SEA
        return Hit("host_hw", "fatal", "host_mce_fatal")
    if "STATUS " in line and "MCGSTATUS" in line and _MCELOG_STATUS.search(line):
        return _mce_status(line, _MCELOG_STATUS)
    if "ockup" in line or "OCKUP" in line:
        if "hard LOCKUP" in line:
            return Hit("host_hw", "fatal", "host_cpu_hard_lockup")
        if "soft lockup" in line:
            return Hit("host_hw", "degraded", "host_cpu_soft_lockup")
    if "stall" in line and "rcu" in line and ("detected stall" in line or "self-detected" in line
                                              or "detected expedited stall" in line):
        return Hit("host_hw", "degraded", "host_rcu_stall")
    if "blocked for more than" in line and "task " in line:
        return Hit("host_hw", "degraded", "host_hung_task")
    if "emperature above threshold" in line:  # the CPU is throttled
        return Hit("host_hw", "degraded", "host_cpu_thermal")
    if "critical temperature reached" in line and "shutting down" in line:  # the kernel powers off
        return Hit("host_hw", "fatal", "host_thermal_shutdown")
    if "Memory failure:" in line and "unhandlable page" in line:  # memory_failure() gave up
        return Hit("host_hw", "fatal", "host_memory_uncorrectable")
    if "oing" in line and "ssert" in line and _SEL_THRESHOLD.search(line, 0, SCAN_CHARS):
        return Hit("host_hw", "degraded", "host_bmc_sensor")
    if "SMART Failure" in line or "DegradedArray event" in line:  # smartd, mdadm: a disk failing
        return Hit("host_hw", "degraded", "host_storage_error")
    if "XFS (" in line and "orruption" in line and "detected" in line:
        return Hit("host_hw", "degraded", "host_storage_error")  # XFS shuts the filesystem down
    if "upply" in line and ("Power Supply Failure" in line or "power supply fail" in line
                            or "Power Supply AC lost" in line):  # Aegis: power failures
        return Hit("host_hw", "fatal", "host_power_failure")
    if "panic" in line and "Kernel panic - not syncing" in line:
        return Hit("host_hw", "fatal", "host_kernel_panic")
    if "not responding, still trying" in line or "not responding, timed out" in line:  # NFS
        # hard mounts retry; a soft mount's timed-out request fails the I/O
        return Hit("host_hw", "degraded", "host_storage_error")
    if ("nvme" in line or "ourna" in line or "LNet" in line or "Lustre" in line) and (
            "timeout, aborting" in line or any(k in line for k in _STORAGE_STALL)
            or "capacity change" in line and _STORAGE_GONE.search(line, 0, SCAN_CHARS)):
        return Hit("host_hw", "degraded", "host_storage_error")
    if ("emory" in line or "oom" in line or "OOM" in line or "Killed process" in line) and (
            "Out of memory: Kill" in line or "oom-kill" in line or "oom_kill event" in line
            or "Memory cgroup out of memory" in line or ": Out Of Memory" in line
            or "OOMKilled" in line  # Kubernetes: the pod's container
            or "low on resource: memory" in line  # Kubernetes: the kubelet evicted the pod
            or "killed by the OOM killer" in line or "systemd-oomd killed" in line  # systemd
            or "systemd-oomd[" in line and ": Killed " in line
            or "exceeded memory limit" in line and "being killed" in line  # slurmstepd
            or "Exceeded job memory limit" in line and "at some point" not in line
            or "Killed process" in line and "total-vm:" in line):  # older kernels' wording
        return Hit("cuda_app_error", "fatal", "host_oom_kill")  # the kernel, a cgroup, Slurm
    return None


_MCE_CPU = re.compile(r"CPU \d+: Machine Check (?:Exception|Event): ")  # not mcelog's banner
_MCE_BANK = re.compile(r"Bank \d+: ([0-9a-fA-F]{16})\b")


def _mce_status(line: str, rx: re.Pattern[str] = _MCE_BANK, worst: str = "fatal") -> Hit:
    """``CPU n: Machine Check Exception|Event: mcg Bank b: STATUS`` (or mcelog's ``STATUS s
    MCGSTATUS m``): MCi_STATUS says it, bit 61 UC (uncorrected), bit 57 PCC (processor
    context corrupt). ``worst``: degraded for a status found by polling (at boot: the last
    boot's error, which the host survived or was rebooted for)."""
    m = rx.search(line, 0, SCAN_CHARS)
    if m is None:
        return Hit("host_hw", "degraded", "host_mce")
    status = int(m.group(1), 16)
    if not status >> 61 & 1:
        return Hit("host_hw", "info", "host_mce_corrected")
    return Hit("host_hw", worst if status >> 57 & 1 else "degraded", "host_mce")


def _mce(line: str) -> Hit:
    """A machine check / APEI ``[Hardware Error]`` line."""
    if "PCIe error" in line:  # APEI reporting a PCIe error (severity on its own line)
        return Hit("pcie", "degraded", "pcie_apei_error", pci=first_bus(line))
    if any(k in line for k in _MCE_FATAL):
        return Hit("host_hw", "fatal", "host_mce_fatal")
    low = line.lower()
    if "corrected" in low and "uncorrected" not in low:  # "corrected by h/w", "type: corrected"
        return Hit("host_hw", "info", "host_mce_corrected")
    if _MCE_CPU.search(line, 0, SCAN_CHARS):
        return _mce_status(line)
    if _MCE_POLLED.search(line, 0, SCAN_CHARS):
        return _mce_status(line, worst="degraded")
    if "[Hardware Error]" in line and "severity" not in line and "events logged" not in line:
        return Hit("host_hw", "info", "host_mce_detail")  # an APEI record's body line
    return Hit("host_hw", "degraded", "host_mce")


HARDWARE = (*DEVICES, host)  # the software groups: log_rules_software.SOFTWARE
