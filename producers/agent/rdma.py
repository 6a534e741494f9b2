"""RDMA NIC counters from sysfs (Aegis §5.1 abnormal-operation metrics: Retran, ECN, CNP).

Layout (Documentation/infiniband/sysfs.txt; mlx5 hw_counters from
drivers/infiniband/hw/mlx5/counters.c)::

    <root>/class/infiniband/<dev>/ports/<port>/state          "4: ACTIVE"
    <root>/class/infiniband/<dev>/ports/<port>/counters/*     IB PortCounters (PMA)
    <root>/class/infiniband/<dev>/ports/<port>/hw_counters/*  driver counters (mlx5 Q/cong)

``port_xmit_data`` and ``port_rcv_data`` count 4-byte words, so bytes = words × 4. Rates
come from :mod:`producers.agent.rates` (wrap and reset safe). The ``counters/`` files are the
PMA PortCounters fields (drivers/infiniband/core/sysfs.c PORT_PMA_ATTR widths: 4, 8, 16 or
32 bits; 64-bit ``port_*_data`` only with PortCountersExtended), and PMA counters *saturate*
at all ones instead of wrapping: a saturated counter's rate is unknown, so it is left out
(said once) until the counter is cleared, rather than read as 0. NIC ids are
``<host>/nic<i>``: i is the position of (device, port) in natural order at first sight
(mlx5_2 before mlx5_10) or in the ``nics`` list when one is given (NIC i is rail i, paired
with GPU i). A device that disappears reports ``nic_link_up`` 0 and zero rates and is
announced once; it is re-baselined when it comes back.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

from producers.agent.collector import Notices, Partial
from producers.agent.rates import RateTracker
from schemas.inventory import normalise_bus_id

# metric -> (counter files summed, scale). Files are "counters/x" or "hw_counters/x".
RATE_METRICS: dict[str, tuple[tuple[str, ...], float]] = {
    "nic_tx_bps": (("counters/port_xmit_data",), 4.0),
    "nic_rx_bps": (("counters/port_rcv_data",), 4.0),
    "nic_retrans_per_s": (("hw_counters/local_ack_timeout_err", "hw_counters/packet_seq_err"), 1.0),
    "nic_ecn_per_s": (("hw_counters/np_ecn_marked_roce_packets",), 1.0),
    "nic_cnp_sent_per_s": (("hw_counters/np_cnp_sent",), 1.0),
    "nic_cnp_handled_per_s": (("hw_counters/rp_cnp_handled",), 1.0),
    "nic_out_of_seq_per_s": (("hw_counters/out_of_sequence",), 1.0),
    # not in the catalogue yet (kept in --once output): IB port error counters
    "nic_port_err_per_s": (("counters/port_rcv_errors", "counters/port_xmit_discards",
                            "counters/symbol_error", "counters/link_error_recovery",
                            "counters/local_link_integrity_errors",
                            "counters/excessive_buffer_overrun_errors",
                            "counters/port_rcv_remote_physical_errors"), 1.0),
}
RAW_METRICS: dict[str, str] = {"nic_link_downed_total": "counters/link_downed"}
# PMA PortCounters field widths (IBA §16.1.3.5; Linux drivers/infiniband/core/sysfs.c)
PMA_WIDTH: dict[str, int] = {
    "counters/symbol_error": 16, "counters/link_error_recovery": 8, "counters/link_downed": 8,
    "counters/port_rcv_errors": 16, "counters/port_rcv_remote_physical_errors": 16,
    "counters/port_xmit_discards": 16, "counters/local_link_integrity_errors": 4,
    "counters/excessive_buffer_overrun_errors": 4, "counters/port_xmit_data": 32,
    "counters/port_rcv_data": 32,
}
COUNTER_FILES: tuple[str, ...] = tuple(sorted(
    {f for files, _ in RATE_METRICS.values() for f in files} | set(RAW_METRICS.values())))

Port = tuple[str, str]  # (device, port number)


def natural_key(name: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def parse_state(text: str) -> float | None:
    """``"4: ACTIVE"`` → 1.0; any other state → 0.0; unreadable → None."""
    head = text.strip().split(":", 1)[0].strip()
    if head.isdigit():
        return 1.0 if int(head) == 4 else 0.0
    return 1.0 if "ACTIVE" in text.upper() else (0.0 if text.strip() else None)


class _Vanished(Exception):
    pass


def _key_of(port: Port) -> Callable[[Hashable], bool]:
    return lambda k: isinstance(k, tuple) and k[0] == port


class RdmaCollector:
    name = "rdma"

    def __init__(self, host: str, sysfs_root: str | os.PathLike[str] = "/sys",
                 notices: Notices | None = None, nics: Sequence[str] | None = None) -> None:
        self.host = host
        self.base = Path(sysfs_root) / "class" / "infiniband"
        self.notices = notices or Notices()
        self.wanted = list(nics) if nics else None
        self.index: dict[Port, int] = {}
        self.rates = RateTracker()

    def nic_names(self) -> dict[str, str]:
        """NIC id → ``device/port``, for the inventory and the --once output."""
        return {self.nic_id(i): f"{d}/{p}" for (d, p), i in sorted(self.index.items(),
                                                                     key=lambda kv: kv[1])}

    def nic_bus_ids(self) -> list[str]:
        """PCI bus id of NIC i at index i, for the inventory's ``nic_bus_ids``: the function
        ``<class>/infiniband/<dev>/device`` links to (``../../../0000:3b:00.0``), normalised
        like the GPUs'. ``""`` where there is none: a software device (rxe, siw) or an
        unreadable link; the kernel's netdev lines cannot be matched to that NIC."""
        out = [""] * (max(self.index.values(), default=-1) + 1)
        for (dev, _), i in self.index.items():
            try:
                target = os.readlink(self.base / dev / "device")
            except OSError:
                continue
            out[i] = normalise_bus_id(os.path.basename(target.rstrip("/"))) or ""
        return out

    def nic_id(self, i: int) -> str:
        return f"{self.host}/nic{i}"

    def _listdir(self, path: Path) -> list[str] | None:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            self.notices.once(f"rdma:list:{path}", f"RDMA: cannot list {path}: {e.strerror}")
            return None

    def discover(self) -> list[Port]:
        devs = self._listdir(self.base)
        if devs is None:
            if not self.index:
                self.notices.once("rdma:none", f"RDMA not available: no {self.base}")
            return []
        found: list[Port] = []
        for dev in sorted(devs, key=natural_key):
            for port in sorted(self._listdir(self.base / dev / "ports") or [], key=natural_key):
                found.append((dev, port))
        if not found and not self.index:
            self.notices.once("rdma:none", f"RDMA not available: no devices under {self.base}")
        return found

    def _assign(self, found: list[Port]) -> None:
        if self.wanted is not None:
            for i, name in enumerate(self.wanted):
                dev, _, port = name.partition("/")
                self.index.setdefault((dev, port or "1"), i)
            return
        for p in found:
            if p not in self.index:
                self.index[p] = max(self.index.values(), default=-1) + 1

    def _read(self, path: Path) -> str | None:
        try:
            with open(path, "rb") as fh:
                return fh.read(256).decode("ascii", "replace")
        except FileNotFoundError:
            return None
        except OSError as e:
            self.notices.once(f"rdma:read:{path}", f"RDMA: cannot read {path}: {e.strerror}")
            return None

    def _read_port(self, port: Port) -> tuple[float | None, dict[str, int]]:
        root = self.base / port[0] / "ports" / port[1]
        state = self._read(root / "state")
        if state is None and not root.is_dir():
            raise _Vanished()
        counters: dict[str, int] = {}
        for name in COUNTER_FILES:
            text = self._read(root / name)
            if text is not None and text.strip().isdigit():
                counters[name] = int(text.strip())
        return (parse_state(state) if state is not None else None), counters

    def collect(self, now: float) -> Partial:
        out = Partial()
        found = self.discover()
        self._assign(found)
        present = set(found)
        for port, i in self.index.items():
            nic = self.nic_id(i)
            label = f"{port[0]}/{port[1]}"
            try:
                if port not in present:
                    raise _Vanished()
                link_up, counters = self._read_port(port)
            except _Vanished:
                self.notices.once(f"rdma:gone:{label}", f"RDMA device {label} ({nic}) disappeared")
                self.rates.forget(_key_of(port))
                out.put("nic", nic, "nic_link_up", 0.0)
                for metric in RATE_METRICS:
                    out.put("nic", nic, metric, 0.0)
                continue
            self.notices.clear(f"rdma:gone:{label}", f"RDMA device {label} ({nic}) is back")
            if link_up is not None:
                out.put("nic", nic, "nic_link_up", link_up)
            self._put_rates(out, nic, port, now, counters)
        return out

    def _put_rates(self, out: Partial, nic: str, port: Port, now: float,
                   counters: dict[str, int]) -> None:
        rates: dict[str, float] = {}
        for name, value in counters.items():
            r = self.rates.update((port, name), now, value)
            if self._saturated(port, name, value):
                continue
            if r is not None:
                rates[name] = r.per_s
                if r.how == "reset":  # every reset is worth a line; re-arm at once
                    key = f"rdma:reset:{port}:{name}"
                    self.notices.once(key, f"RDMA counter {port[0]}/{port[1]} {name} was reset")
                    self.notices.clear(key)
        for metric, (files, scale) in RATE_METRICS.items():
            have = [rates[f] for f in files if f in rates]
            if have:
                out.put("nic", nic, metric, sum(have) * scale)
        for metric, f in RAW_METRICS.items():
            if f in counters:
                out.put("nic", nic, metric, float(counters[f]))

    def _saturated(self, port: Port, name: str, value: int) -> bool:
        """A PMA counter stuck at its all-ones maximum (32-bit data counters only until they
        have read above 2**32, i.e. unless the HCA has the extended counters)."""
        width = PMA_WIDTH.get(name)
        key = f"rdma:saturated:{port[0]}/{port[1]}:{name}"
        if width is None or value != (1 << width) - 1 or self.rates.wide((port, name)):
            self.notices.clear(key)
            return False
        self.notices.once(key, f"RDMA counter {port[0]}/{port[1]} {name} is saturated at {value} "
                          f"(a {width}-bit PMA counter stops at its maximum); its rate is left out "
                          "until the counter is cleared (perfquery -x -R, or a driver reload)")
        return True

    def close(self) -> None:
        pass
