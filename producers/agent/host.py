"""Host CPU and memory from /proc (Aegis §5.1 performance metrics: CPU utilisation).

CPU utilisation is the busy share of all jiffies between two readings of the ``cpu`` line of
/proc/stat (busy = total − idle − iowait); memory used is (MemTotal − MemAvailable) /
MemTotal from /proc/meminfo. The device id is the host name.
"""

from __future__ import annotations

import os
from pathlib import Path

from producers.agent.collector import Notices, Partial


def parse_cpu_line(text: str) -> tuple[int, int] | None:
    """(total, idle) jiffies from the aggregate ``cpu`` line, or None."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            fields = [int(x) for x in line.split()[1:] if x.isdigit()]
            if len(fields) < 4:
                return None
            # user nice system idle iowait irq softirq steal guest guest_nice; guest time
            # is already counted in user/nice, so sum the first eight only
            total = sum(fields[:8])
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
            return total, idle
    return None


def parse_mem_used_pct(text: str) -> float | None:
    info: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            info[key.strip()] = int(parts[0])
    total = info.get("MemTotal")
    if not total:
        return None
    avail = info.get("MemAvailable")
    if avail is None:  # kernels before 3.14
        avail = info.get("MemFree", 0) + info.get("Buffers", 0) + info.get("Cached", 0)
    return max(0.0, min(100.0, 100.0 * (total - avail) / total))


class HostCollector:
    name = "host"

    def __init__(self, host: str, proc_root: str | os.PathLike[str] = "/proc",
                 notices: Notices | None = None) -> None:
        self.host = host
        self.proc = Path(proc_root)
        self.notices = notices or Notices()
        self._last_cpu: tuple[int, int] | None = None

    def _read(self, name: str) -> str | None:
        try:
            return (self.proc / name).read_text()
        except OSError as e:
            self.notices.once(f"host:{name}", f"host: cannot read {self.proc / name}: {e.strerror}")
            return None

    def collect(self, now: float) -> Partial:
        out = Partial()
        stat = self._read("stat")
        cpu = parse_cpu_line(stat) if stat else None
        if cpu is not None:
            if self._last_cpu is not None:
                d_total = cpu[0] - self._last_cpu[0]
                d_idle = cpu[1] - self._last_cpu[1]
                if d_total > 0 and 0 <= d_idle <= d_total:
                    out.put("host", self.host, "host_cpu_util_pct", 100.0 * (d_total - d_idle) / d_total)
            self._last_cpu = cpu
        mem = self._read("meminfo")
        pct = parse_mem_used_pct(mem) if mem else None
        if pct is not None:
            out.put("host", self.host, "host_mem_used_pct", pct)
        return out

    def close(self) -> None:
        pass
