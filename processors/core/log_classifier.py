"""Log-line classifier for Aegis Phase 1: one raw line in, one :class:`LogEvent` out.

Categories (what the decision tree reasons about, Aegis Phase 1):

    critical_gpu        host-side GPU fault that breaks the job (XID 48/79/94/95, GSP hang)
    benign_gpu          GPU event that must NOT isolate (XID 63/64/92, DCGM power/clock)
    nvlink              NVLink errors (XID 74, 144-150, NVRM nvlink messages)
    pcie                PCIe AER reports, link width/speed degradation
    nic_or_link         host NIC: mlx5 firmware health, module/cable, CQE errors, link state
    host_hw             the host itself: EDAC, machine checks, lockups, hung tasks, thermal,
                        power, kernel panics, storage
    distributed_symptom NCCL/PyTorch errors between ranks: timeouts, resets, remote exits
    cuda_app_error      the application's own errors: CUDA OOM, illegal access, XID 13/31/43,
                        the host's OOM killer ending it
    config              configuration: NCCL env/HCA, version or collective mismatch, the GPU
                        stack not ready (NVML driver mismatch, fabric manager down)
    other               ordinary output

Severity is ``fatal`` (breaks the job), ``degraded`` or ``info``. XIDs take their category,
severity and action hint from the :class:`~processors.core.xid_policy.XidPolicy`. The rules
live in :mod:`processors.core.log_rules`; they test plain substrings before any regex, so an
ordinary training line costs a few substring scans. :func:`classify` never raises.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from processors.core import log_rules
from processors.core.log_rules_host import HARDWARE
from processors.core.log_rules_software import SOFTWARE
from processors.core.xid_policy import XidPolicy, default_policy
from schemas.inventory import HostInventory, normalise_bus_id

MAX_LINE_CHARS = 65536  # longer lines are classified on their first and last parts
_HOST_SIDE = frozenset(("critical_gpu", "benign_gpu", "nvlink", "pcie", "nic_or_link", "host_hw"))
_PEER_GID = re.compile(r"remoteGids?\s?:*(?:ffff:)?(\d{1,3}(?:\.\d{1,3}){3})")
_PEER_V6 = re.compile(r"\b([0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{0,4}){2,7})(?:%[\w.-]+)?<(\d{1,5})>")
_PEER_PORT = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}|[A-Za-z][\w.-]{0,252})<(\d{1,5})>")
_PEER_REMOTE = re.compile(r"(?:remote=|connect to )\[(?:::ffff:)?([^\]\s]{1,255})\]:(\d{1,5})")  # c10d
_PEER_HOST = re.compile(r"(?:to host|connect to) (\d{1,3}(?:\.\d{1,3}){3}|[A-Za-z][\w.-]{0,252}):(\d{1,5})\b")
_PEER_PAREN = re.compile(r"\[([\w.-]+)\]:(\d{1,5})")
_RANK = re.compile(r"[\[ ][Rr]ank ?(\d{1,7})\]")
_GROUPS = (*HARDWARE, *SOFTWARE)
_NCCL_FIRST = (*SOFTWARE, *HARDWARE)  # an NCCL line is NCCL's before it is a NIC's
_PEER_RANK = re.compile(r"\b(?:peer|remote) rank:? ?(\d{1,7})\b|Proxy Call to rank (\d{1,7})\b")
_UNIQUE_ID_RANK = re.compile(r"\[(\d{1,7})\] is setting up NCCL communicator")  # PyTorch, no "rank"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # colour codes (SGR) and other CSI sequences
# how long a timed-out operation had been waiting: PyTorch's watchdog ("Timeout(ms)=600000)
# ran for 600412 milliseconds"), else the timeout it waited out (Gloo: "Timed out waiting
# 1800000ms")
_RAN_FOR = re.compile(r"\bran for (\d{1,12}) ?(?:milliseconds|ms)\b")
_WAITED_OUT = re.compile(r"Timeout\(ms\)=(\d{1,12})|[Tt]imed out waiting (\d{1,12}) ?ms\b"
                         r"|wait timeout after (\d{1,12}) ?ms\b")  # TCPStore's get/wait
# c10d's client socket "has timed out after 60s", the store's "Timed out after 900 seconds"
_WAITED_AFTER = re.compile(r"[Tt]imed out after (\d{1,9}) ?(?:s|seconds?)\b")
MAX_WAITED_S = 86400.0  # a longer figure is not believed (it would date the fault days back)


@dataclass(frozen=True, slots=True)
class LogEvent:
    """What one log line says. ``gpu`` is the host's GPU index, via the host inventory."""

    category: str = "other"
    severity: str = "info"
    rule: str = "unmatched"
    xid: int | None = None
    pci_bus_id: str | None = None  # normalised: 0000:3b:00.0
    gpu: int | None = None
    peer: str | None = None  # ip[:port] or hostname[:port] the line names as the other end
    peer_rank: int | None = None
    rank: int | None = None  # the reporting rank, when the line names it ([Rank 3])
    device: str | None = None  # NIC port or netdev (mlx5_0, ib0, eth5)
    action: str = "none"  # XID policy hint: isolate_gpu | isolate_host | restart_job | none
    # a timeout: seconds the operation had been waiting when it timed out (so it began at
    # the line's time minus this)
    waited_s: float | None = None

    @property
    def host_side(self) -> bool:
        return self.category in _HOST_SIDE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


OTHER = LogEvent()


def _bus(raw: str | None) -> str | None:
    if not raw:
        return None
    if raw.count(":") == 2 and "." not in raw:  # NVRM writes PCI:0000:3b:00 (no function)
        raw += ".0"
    return normalise_bus_id(raw)


def _peer(line: str) -> str | None:
    m = _PEER_GID.search(line, 0, log_rules.SCAN_CHARS)
    if m:
        return m.group(1)
    m = _PEER_V6.search(line, 0, log_rules.SCAN_CHARS)
    if m:
        return f"[{m.group(1)}]:{m.group(2)}"
    m = _PEER_REMOTE.search(line, 0, log_rules.SCAN_CHARS) or _PEER_HOST.search(
        line, 0, log_rules.SCAN_CHARS)
    if m:
        return f"{m.group(1)}:{m.group(2)}"
    m = _PEER_PORT.search(line, 0, log_rules.SCAN_CHARS)
    if m:
        return f"{m.group(1)}:{m.group(2)}"
    m = _PEER_PAREN.search(line, 0, log_rules.SCAN_CHARS)
    return f"{m.group(1)}:{m.group(2)}" if m else None


def _waited(line: str) -> float | None:
    m = _RAN_FOR.search(line) or _WAITED_OUT.search(line)
    if m is None:
        m = _WAITED_AFTER.search(line)
        return None if m is None else min(float(m.group(1)), MAX_WAITED_S)
    return min(int(next(g for g in m.groups() if g)) / 1000.0, MAX_WAITED_S)


def _int(rx: re.Pattern[str], line: str) -> int | None:
    m = rx.search(line, 0, log_rules.SCAN_CHARS)
    return int(next(g for g in m.groups() if g)) if m else None


_LOST_GPU = frozenset(("gpu_fallen_off_bus", "gpu_lost"))  # XID 79 in other words


def _event(hit: log_rules.Hit, line: str, inv: HostInventory | None,
           policy: XidPolicy) -> LogEvent:
    pci = _bus(hit.pci)
    if pci is None and hit.category in _HOST_SIDE and hit.rule.startswith("dcgm_"):
        pci = _bus(log_rules.first_bus(line))
    gpu = inv.gpu_for_bus(pci) if (inv is not None and pci) else None
    severity = hit.severity
    if hit.rule == "iommu_dma_fault" and gpu is not None:
        severity = "degraded"  # one of the host's GPUs had its DMA refused
    peer = peer_rank = rank = None
    waited = _waited(line) if (hit.category == "distributed_symptom"
                               and hit.rule.endswith("_timeout")) else None
    if hit.category in ("distributed_symptom", "config", "cuda_app_error"):
        rank = _int(_RANK, line)
        if rank is None and "is setting up NCCL" in line:
            rank = _int(_UNIQUE_ID_RANK, line)
        if hit.category != "cuda_app_error":
            peer = hit.peer or _peer(line)
            peer_rank = _int(_PEER_RANK, line)
    # the driver's or NVML's words for XID 79 take XID 79's action (isolate the host), also
    # when the Xid line comes later or never
    action = policy.lookup(79).action if hit.rule in _LOST_GPU and severity == "fatal" else "none"
    device = hit.device
    if hit.category == "nic_or_link" and inv is not None and pci is not None:
        nic = inv.nic_for_bus(pci)  # the netdev (enp220s0np0) of a listed NIC: its listed name
        device = inv.nics[nic] if nic is not None else device
    return LogEvent(hit.category, severity, hit.rule, hit.xid, pci, gpu, peer, peer_rank,
                    rank, device, action=action, waited_s=waited)


def _xid_event(x: int, raw_bus: str | None, line: str, policy: XidPolicy,
               inv: HostInventory | None) -> LogEvent:
    rule = policy.lookup(x)
    severity = rule.severity
    if rule.category == "nvlink":
        severity = log_rules.xid_line_severity(line) or severity
    pci = _bus(raw_bus)
    gpu = inv.gpu_for_bus(pci) if (inv is not None and pci) else None
    return LogEvent(rule.category, severity, f"xid_{x}", x, pci, gpu, action=rule.action)


def _classify(line: str, inv: HostInventory | None, policy: XidPolicy) -> LogEvent:
    x = log_rules.xid(line)
    if x is not None:
        return _xid_event(x[0], x[1], line, policy, inv)
    for group in _NCCL_FIRST if "NCCL" in line else _GROUPS:
        hit = group(line)
        if hit is not None:
            return _event(hit, line, inv, policy)
    return OTHER


def _json_message(line: str) -> str:
    """The message of a Docker json-file record (``{"log": "...\\n", ...}``) or of a
    ``journalctl -o json`` record (``MESSAGE``, a string or, for non-UTF-8, a list of bytes);
    any other line is returned as it is."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line
    msg = obj.get("log", obj.get("MESSAGE")) if isinstance(obj, dict) else None
    if isinstance(msg, list) and all(isinstance(b, int) and 0 <= b < 256 for b in msg):
        msg = bytes(msg).decode("utf-8", "replace")
    return msg.rstrip("\r\n") if isinstance(msg, str) else line


def unframe(line: str) -> str:
    """Undo the framings that change a line's text, not just prefix it: Docker's and
    journald's JSON records (whose escapes hide ``<port>`` and quotes), ANSI colour codes
    and NUL bytes. Prefixes (dmesg and syslog timestamps, CRI, srun, ``[rank3]:``) need
    nothing: the rules look for substrings anywhere in the line."""
    if line.startswith("{") and ('"log":' in line or '"MESSAGE":' in line):
        line = _json_message(line)
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if "\x00" in line:
        line = line.replace("\x00", " ")
    return line


def classify(line: str, source: str | None = None, host_inventory: HostInventory | None = None,
             policy: XidPolicy | None = None) -> LogEvent:
    """Classify one log line. ``source`` (kernel, training, nccl, agent, dcgm) is a hint only:
    every rule runs on every line, because agents mislabel and tools re-emit each other's lines.
    Never raises: anything unexpected yields ``other``/``info`` with rule ``unreadable``."""
    try:
        if not isinstance(line, str):
            line = (line.decode("utf-8", "replace") if isinstance(line, bytes | bytearray)
                    else str(line))
        line = unframe(line)
        if len(line) > MAX_LINE_CHARS:
            half = MAX_LINE_CHARS // 2
            line = line[:half] + " " + line[-half:]
        return _classify(line, host_inventory, policy or default_policy())
    except Exception:  # noqa: BLE001 - a classifier on a log stream must not take the stream down
        return LogEvent(rule="unreadable")
